"""What `cairnqd list` shows per task, its "N more" line, and `inspect --follow`."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from cairnqd.attempts import attempts_shown
from cairnqd.models import STATUSES, Task
from cairnqd.store.base import TaskStore
from cairnqd.store.dependencies import WAITING_RUN_AT
from cairnqd.store.operator import TaskFilter

LIST_HEADERS = [
    "ID", "QUEUE", "NAME", "STATUS", "ATTEMPT", "PRIORITY", "CREATED", "RUN_AT", "DURATION",
    "ERROR",
]  # fmt: skip
_ERROR_WIDTH = 48
#: How often `inspect --follow` reads the task.
FOLLOW_POLL_S = 0.5


def _clock(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms == WAITING_RUN_AT:  # past any datetime: a task held by its dependencies
        return "after-deps"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(ms: int) -> str:
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    if s < 3600:
        return f"{int(s) // 60}m{int(s) % 60:02d}s"
    return f"{int(s) // 3600}h{int(s) % 3600 // 60:02d}m"


def duration(task: Task, now_ms: int) -> str:
    """From the last time it became due (run-at) to when it finished, or to now while
    it runs: the protocol keeps no start time, so this is queue wait plus run time of
    the last attempt. "-" for a task still waiting."""
    if task.completed_at_ms is not None:
        return _seconds(max(0, task.completed_at_ms - task.run_at_ms))
    if task.status == "running":
        return _seconds(max(0, now_ms - task.run_at_ms)) + "+"
    return "-"


def error_text(error: Any, width: int = _ERROR_WIDTH) -> str:
    """The stored error envelope in one short cell: `code: message`."""
    if error is None:
        return ""
    if isinstance(error, dict):
        code = error.get("code") or error.get("type") or ""
        message = str(error.get("message") or "")
        text = f"{code}: {message}" if code and message else str(code or message)
    else:
        text = str(error)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def list_rows(tasks: Sequence[Task], now_ms: int) -> list[list[Any]]:
    return [
        [t.id, t.queue, t.name, t.status, attempts_shown(t.attempt, t.max_attempts),
         t.priority, _clock(t.created_at_ms), _clock(t.run_at_ms), duration(t, now_ms),
         _row_error(t)]
        for t in tasks
    ]  # fmt: skip


def _row_error(task: Task) -> str:
    """The row's error; a task that succeeded keeps an earlier attempt's, so says so."""
    text = error_text(task.error)
    if not text:
        return "-"
    return f"earlier attempt: {text}" if task.status == "succeeded" else text


def matching(status: str | None, queue: str | None, name: str | None) -> TaskFilter:
    """`list`'s filters as a count's."""
    return TaskFilter(statuses=(status,) if status else STATUSES, queue=queue, name=name)


def more_line(total: int, offset: int, shown: int) -> str | None:
    rest = total - offset - shown
    if rest <= 0:
        return None
    return f"{rest} more (next page: --offset {offset + shown})"


def _progress_line(task: Task) -> str:
    attempt = attempts_shown(task.attempt, task.max_attempts)
    parts = [time.strftime("%H:%M:%S"), task.status, f"attempt {attempt}"]
    if task.progress is not None:
        parts.append(
            f"progress {task.progress:.0%}" if task.progress <= 1 else f"progress {task.progress:g}"
        )
    if task.message:
        parts.append(task.message)
    if task.error is not None and task.status != "running":
        earlier = "earlier attempt's error" if task.status == "succeeded" else "error"
        parts.append(f"{earlier} {error_text(task.error, 120)}")
    return "  ".join(parts)


async def follow(store: TaskStore, task_id: str) -> Task | None:
    """Print a line each time the task's status, attempt, progress or message
    changes, until it ends (or None if it does not exist, or vanished)."""
    last: tuple[Any, ...] | None = None
    while True:
        task = await store.get(task_id)
        if task is None:
            return None
        seen = (task.status, task.attempt, task.progress, task.message)
        if seen != last:
            last = seen
            print(_progress_line(task), flush=True)
        if task.is_terminal:
            return task
        await asyncio.sleep(FOLLOW_POLL_S)


def follow_done(task: Task) -> int:
    """The exit code once a followed task ended: 0 when it succeeded."""
    if task.status == "succeeded":
        return 0
    print(f"task {task.id} {task.status}", file=sys.stderr)
    return 1
