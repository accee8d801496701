"""A handler whose child dies right after it returns (`returned_handlers:registry`).

Loaded into a real daemon child, this module wraps the child's observer so that the
first time a task of `r.die_after_return` has its result queued, the child SIGKILLs
itself: exactly the window between a handler's return and its result's commit that a
crash can hit. The marker file named in the payload makes it happen once.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from cairnqd.context import TaskContext
from cairnqd.daemon.child.reporter import ChildReporter
from cairnqd.registry import TaskRegistry
from tests.daemon.fault_handlers import record

registry = TaskRegistry()

_queued = ChildReporter.task_returned


def _die_once_after_return(self: ChildReporter, ctx: TaskContext) -> None:
    _queued(self, ctx)  # the start table says "returned" first
    task = ctx.task
    marker = task.payload.get("marker") if isinstance(task.payload, dict) else None
    if task.name == "r.die_after_return" and marker and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


ChildReporter.task_returned = _die_once_after_return  # type: ignore[method-assign]


@registry.task("r.die_after_return")
async def die_after_return(ctx: Any, payload: Any) -> str:
    record(payload, "start", ctx)
    record(payload, "end", ctx)
    return "done"
