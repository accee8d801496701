"""Handlers whose import takes a second: a window to kill children while they boot."""

from __future__ import annotations

import time
from typing import Any

from cairnqd.registry import TaskRegistry

time.sleep(1.0)

registry = TaskRegistry()


@registry.task("s.echo")
async def echo(ctx: Any, payload: Any) -> Any:
    return payload
