"""Task-aware logs: every record made while a handler runs names its task.

The worker sets `CURRENT` around each handler call (a sync handler's thread gets a copy
of the call's context), and `install()` wraps the process's log record factory so any
logger's record made meanwhile carries the task's id, name, queue and attempt, and the
trace and span ids of its process span when tracing is on. Nothing is asked of the
handler. The attributes are prefixed (`cairnq_task_id`, ...) so they never collide
with an application's own `extra=` fields; `fields()` gives them under short names for
formatters (the daemon's json format, `prefix()` for its text one).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cairnqd.context import TaskContext

__all__ = ["CURRENT", "TaskLogger", "fields", "install", "prefix"]

#: The task whose handler runs in this context; None outside handlers and in a batch
#: handler's call (which holds many tasks).
CURRENT: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "cairnq_task", default=None
)

#: record attribute -> field name in `fields()`.
ATTRIBUTES = {
    "cairnq_task_id": "task_id",
    "cairnq_task_name": "task_name",
    "cairnq_queue": "queue",
    "cairnq_attempt": "attempt",
    "cairnq_trace_id": "trace_id",
    "cairnq_span_id": "span_id",
}


class _TaskRecordFactory:
    """Wraps the factory that was in place; marks records made inside a handler."""

    def __init__(self, base: Callable[..., logging.LogRecord]) -> None:
        self.base = base

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.base(*args, **kwargs)
        ctx = CURRENT.get()
        if ctx is not None:
            annotate(record, ctx)
        return record


def install() -> None:
    """Make every log record in this process task-aware (idempotent; the worker calls
    it when it starts)."""
    current = logging.getLogRecordFactory()
    if not isinstance(current, _TaskRecordFactory):
        logging.setLogRecordFactory(_TaskRecordFactory(current))


def annotate(record: logging.LogRecord, ctx: TaskContext) -> None:
    task = ctx.task
    record.cairnq_task_id = task.id
    record.cairnq_task_name = task.name
    record.cairnq_queue = task.queue
    record.cairnq_attempt = task.attempt
    span = ctx.trace_span
    if span is not None:
        ids = span.get_span_context()
        record.cairnq_trace_id = format(ids.trace_id, "032x")
        record.cairnq_span_id = format(ids.span_id, "016x")


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The task fields a record carries, under their short names ({} outside tasks)."""
    found = vars(record)
    if "cairnq_task_id" not in found:
        return {}
    return {short: found[attr] for attr, short in ATTRIBUTES.items() if attr in found}


def prefix(record: logging.LogRecord) -> str:
    """A short text prefix naming the task: `[task <id> <name>#<attempt> @<queue>] `."""
    found = vars(record)
    task_id = found.get("cairnq_task_id")
    if task_id is None:
        return ""
    trace = found.get("cairnq_trace_id")
    traced = f" trace={trace}" if trace else ""
    return (
        f"[task {task_id} {found.get('cairnq_task_name')}#{found.get('cairnq_attempt')} "
        f"@{found.get('cairnq_queue')}{traced}] "
    )


class TaskLogger(logging.LoggerAdapter[logging.Logger]):
    """`ctx.logger`: a logger whose records name the task even where the handler's
    context did not follow (a thread the handler started itself)."""

    def __init__(self, logger: logging.Logger, ctx: TaskContext) -> None:
        super().__init__(logger, None)
        self.ctx = ctx

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        install()  # a handler run outside a worker (a test calling it) still gets fields
        token = CURRENT.set(self.ctx)
        try:
            # One frame more than LoggerAdapter's own: the record names the caller.
            kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1
            super().log(level, msg, *args, **kwargs)
        finally:
            CURRENT.reset(token)
