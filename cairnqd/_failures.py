"""What a worker says about a handler that raised: the stored traceback, and the log.

The traceback goes into the error envelope's `details["traceback"]`, capped at
`TRACEBACK_MAX_CHARS` from the end; the log gets one rate-limited record per failed
attempt (docs/architecture.md, "Failures in the log").
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from cairnqd._lograte import Burst
from cairnqd.models import Task

if TYPE_CHECKING:
    from cairnqd.context import TaskContext

log = logging.getLogger("cairnqd.worker")

TRACEBACK_MAX_CHARS = 8192


def format_traceback(exc: BaseException, limit: int = TRACEBACK_MAX_CHARS) -> str:
    text = "".join(traceback.format_exception(exc))
    if len(text) <= limit:
        return text
    return "...(earlier frames cut)\n" + text[len(text) - limit :]


class FailureLog:
    """Logs failed attempts, at most `burst` records per `window_s` with tracebacks."""

    def __init__(
        self, burst: int = 10, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._burst = Burst(burst, window_s, clock)

    def failed(self, ctx: TaskContext, exc: BaseException, task: Task | None) -> None:
        """A handler raised `exc`; `task` is the row after the failure was written
        (None when it could not be written)."""
        held_back = self._burst.admit()
        if held_back is None:
            return
        suffix = f" ({held_back} more failure(s) not logged)" if held_back else ""
        retrying = task is not None and task.status == "queued"
        level = logging.WARNING if retrying else logging.ERROR
        log.log(
            level,
            "task %s (%s) attempt %d/%d failed: %s: %s; %s%s",
            ctx.task_id, ctx.name, ctx.attempt, ctx.task.max_attempts,
            type(exc).__name__, exc, _next_step(task), suffix,
            exc_info=(type(exc), exc, exc.__traceback__),
        )  # fmt: skip


def _next_step(task: Task | None) -> str:
    if task is None:
        return "the failure could not be written; its lease will expire"
    if task.status == "queued":
        at = datetime.fromtimestamp(task.run_at_ms / 1000, UTC)
        stamp = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        wait_s = max(0.0, task.run_at_ms / 1000 - time.time())
        return f"will retry at {stamp} (in {wait_s:.1f}s)"
    if task.status == "canceled":
        return "a cancel was pending: canceled"
    return "no attempts left: failed"
