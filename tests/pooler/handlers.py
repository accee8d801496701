"""Handlers the pooler tests load into real children (`tests.pooler.handlers:registry`)."""

from __future__ import annotations

import time
from typing import Any

from cairnqd.registry import TaskRegistry

registry = TaskRegistry()


@registry.task("p.stamp")
async def stamp(ctx: Any, payload: Any) -> float:
    """When the handler began, by this host's wall clock (the test's too)."""
    return time.time()
