"""Handlers for the lifecycle tests (`tests.daemon.lifecycle_handlers:registry`)."""

from __future__ import annotations

import os
from typing import Any

from cairnqd.registry import TaskRegistry

registry = TaskRegistry()


@registry.task("l.crash")
async def crash(ctx: Any, payload: Any) -> None:
    """Kills its child on every attempt: the group's crash budget drains."""
    os._exit(3)
