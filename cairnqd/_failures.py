"""What a worker says about a handler that raised: the stored traceback and message,
and the log.

The traceback goes into the error envelope's `details["traceback"]`, capped at
`TRACEBACK_MAX_CHARS` from the end, the message is capped at `MESSAGE_MAX_CHARS` from
the start; the log gets one rate-limited record per failed attempt (docs/architecture.md,
"Failures in the log"). Nothing here raises, whatever the exception: its `__str__`,
`__repr__`, notes and chain are the handler author's code, and a failure that cannot be
described must still be written.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from cairnqd._lograte import Burst
from cairnqd.errors import exception_text
from cairnqd.models import Task

if TYPE_CHECKING:
    from cairnqd.context import TaskContext

log = logging.getLogger("cairnqd.worker")

TRACEBACK_MAX_CHARS = 8192
#: The stored message's limit, as the traceback's: a message can hold anything, a
#: whole response body included, and it is read back with every read of the task.
MESSAGE_MAX_CHARS = 8192


def cut_message(text: str, limit: int = MESSAGE_MAX_CHARS) -> str:
    """`text`, or its start with a note of the whole length, `limit` characters in all
    (so cutting again changes nothing)."""
    if len(text) <= limit:
        return text
    note = f"...(cut: {len(text)} characters, the first ones kept)"
    return text[: max(0, limit - len(note))] + note


def format_traceback(exc: BaseException, limit: int = TRACEBACK_MAX_CHARS) -> str:
    """The traceback as `traceback` prints it (which already shows a `str()` that
    fails as `<exception str() failed>`), capped."""
    try:
        text = "".join(traceback.format_exception(exc))
    except BaseException as problem:  # see `_fallback_traceback`
        text = _fallback_traceback(exc, problem)
    if len(text) <= limit:
        return text
    return "...(earlier frames cut)\n" + text[len(text) - limit :]


def _fallback_traceback(exc: BaseException, problem: BaseException) -> str:
    """What can still be shown when `traceback` itself raised (an exception whose
    `__notes__` or `__cause__` is a property that raises, say): the frames, which are
    the interpreter's own, and the exception's line; not its notes or its chain."""
    try:
        frames = traceback.format_tb(exc.__traceback__)
    except BaseException:  # the line below is still worth having
        frames = []
    last = f"{type(exc).__name__}: {exception_text(exc)}\n"
    why = f"(its notes and chain could not be shown: {exception_text(problem)})\n"
    return "".join(["Traceback (most recent call last):\n", *frames, last, why])


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
        # The log's own rendering of `exc` would raise where `traceback` does (inside
        # the handler: a test's, or a logging setup that re-raises); then the text we
        # made stands in for it.
        shown = _renderable(exc)
        log.log(
            level,
            "task %s (%s) attempt %d/%d failed: %s: %s; %s%s%s",
            ctx.task_id, ctx.name, ctx.attempt, ctx.task.max_attempts,
            type(exc).__name__, _writable(cut_message(exception_text(exc))), _next_step(task),
            suffix, "" if shown else "\n" + _writable(format_traceback(exc)),
            exc_info=(type(exc), exc, exc.__traceback__) if shown else None,
        )  # fmt: skip


def _renderable(exc: BaseException) -> bool:
    """Whether the log may render `exc` itself: its traceback formats, as text any log
    handler can write (a message holding a lone surrogate fails a UTF-8 file's write,
    and the record with it)."""
    try:
        "".join(traceback.format_exception(exc)).encode("utf-8")
    except BaseException:  # any failure means: do not let logging try
        return False
    return True


def _writable(text: str) -> str:
    """`text` with any lone surrogate as its escape (`\\udc80`), so that every log
    handler can write it, as the stored error has it (`storable_error`)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


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
