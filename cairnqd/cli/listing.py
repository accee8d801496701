"""What `cairnqd list` shows per task, its "N more" line, and `inspect --follow`; and how
every read command shows a stored value, whatever another client stored in its column.

The database is shared with other clients (the public SDKs, hand-written SQL), and
SQLite is loosely typed: a column declared integer can hold text (`'soon'`), a real or
a blob, a status can be one the protocol does not have (written with its CHECK off).
Reads keep such a value as it was stored (`Task.from_row`), so one row never fails a
command for everyone; the helpers below show a good value as always and any other as
its text marked "(unreadable)", on the row of the task that holds it, and `odd_values`
says which columns of a task hold one, and why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from cairnqd._jsoncodec import Undecodable, UndecodableText
from cairnqd.models import JSON_COLUMNS, MS_COLUMNS, STATUSES, Task
from cairnqd.store.base import TaskStore
from cairnqd.store.dependencies import WAITING_RUN_AT
from cairnqd.store.operator import TaskFilter
from cairnqd.storedvalues import (
    UNREADABLE,
    attempts_text,
    fraction,
    is_int,
    printable,
    raw_text,
    unreadable,
)

LIST_HEADERS = [
    "ID", "QUEUE", "NAME", "STATUS", "ATTEMPT", "PRIORITY", "CREATED", "RUN_AT", "DURATION",
    "ERROR",
]  # fmt: skip
_ERROR_WIDTH = 48
#: How often `inspect --follow` reads the task.
FOLLOW_POLL_S = 0.5

# -- stored values, as they are --------------------------------------------------------

#: The columns of `Task` that hold text, integers, and a real.
TEXT_COLUMNS = (
    "id", "name", "queue", "status", "message", "worker_id", "parent_id", "root_id",
    "correlation_id",
)  # fmt: skip
INT_COLUMNS = ("attempt", "max_attempts", "priority")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: How many tasks holding unreadable values a warning names before it counts the rest.
WARN_TASKS = 10


def utc(ms: int) -> datetime | None:
    """Epoch milliseconds as a UTC time, exactly (integer arithmetic: no float rounding
    moves the last millisecond); None for a time no date holds (before year 1, past
    year 9999)."""
    try:
        return _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:
        return None


def clock(ms: object, *, millis: bool = False, waiting: str = "after-deps") -> str:
    """A time column as UTC, to the second (`millis`: to the millisecond); `-` for none,
    `waiting` for the run-at of a task held by its dependencies; anything that is not a
    date (text, a real, a time before year 1 or past year 9999) as it is, marked."""
    if ms is None:
        return "-"
    if not is_int(ms):
        return unreadable(ms)
    if ms == WAITING_RUN_AT:  # past any datetime: a task held by its dependencies
        return waiting
    when = utc(ms)
    if when is None:
        return unreadable(ms)
    if millis:
        return f"{when:%Y-%m-%dT%H:%M:%S}.{when.microsecond // 1000:03d}Z"
    return f"{when:%Y-%m-%dT%H:%M:%S}Z"


def number(value: object) -> int | str:
    """An integer column's value (priority): the number, or its text marked."""
    return value if is_int(value) else unreadable(value)


def progress_text(value: object) -> str:
    """`40%` for a fraction, `3.5` past 1, `-` for none; anything else marked."""
    if value is None:
        return "-"
    done = fraction(value)
    if done is None:
        return unreadable(value)
    return f"{done:.0%}" if done <= 1 else f"{done:g}"


def status_text(status: object) -> str:
    """A status of the protocol as it is; any other (`paused`, `QUEUED`, written with
    the table's CHECK off) marked: no worker claims or settles it."""
    return status if isinstance(status, str) and status in STATUSES else unreadable(status)


def state_text(state: object) -> str:
    """A state as `state_shown` gives it: `waiting` (queued behind its dependencies),
    or a status, marked when it is none of the protocol's."""
    return "waiting" if state == "waiting" else status_text(state)


def text_value(value: object) -> str:
    """A text column: `-` for none, text as it is, a blob marked."""
    if value is None:
        return "-"
    return printable(value) if isinstance(value, str) else unreadable(value)


def _why(column: str, value: object) -> str | None:
    """Why `value` is not what `column` holds, or None when it is."""
    if column in JSON_COLUMNS:
        if isinstance(value, Undecodable):
            return f"cannot be decoded: {value.reason}"
        if isinstance(value, float) and not math.isfinite(value):
            return "holds a number JSON cannot carry (too large for a 64-bit float)"
        return None
    if value is None:
        return None
    if column in TEXT_COLUMNS:
        if isinstance(value, UndecodableText):
            return value.reason
        if not isinstance(value, str):
            return "not text"
        if column == "status" and value not in STATUSES:
            return f"none of the protocol's statuses ({', '.join(STATUSES)})"
        return None
    if column in INT_COLUMNS:
        return None if is_int(value) else "not an integer"
    if column in MS_COLUMNS:
        if not is_int(value):
            return "not an integer"
        if value == WAITING_RUN_AT or utc(value):
            return None
        return "not a date (before year 1)" if value < 0 else "not a date (past year 9999)"
    if column == "progress":
        if fraction(value) is not None:
            return None
        return "not a finite number" if isinstance(value, float) else "not a number"
    return None


def odd_values(task: Task) -> list[tuple[str, str]]:
    """The columns of `task` holding a value its readers cannot take, with why: what
    another client stored. Costs a type check per column; a JSON value is looked at
    only at its top (an infinite number deeper inside is marked by `shown_json`)."""
    found = []
    for column, value in vars(task).items():
        why = _why(column, value)
        if why is not None:
            found.append((column, why))
    return found


def odd_lines(tasks: Sequence[Task]) -> list[str]:
    """One line per task that holds unreadable values (at most `WARN_TASKS`, then how
    many more), naming the task, each column, what it holds and why it is unreadable."""
    lines = []
    odd = [(t, found) for t in tasks if (found := odd_values(t))]
    for task, found in odd[:WARN_TASKS]:
        said = "; ".join(
            f"{column} {why}"
            if column in JSON_COLUMNS
            else f"{column} holds '{raw_text(getattr(task, column))}': {why}"
            for column, why in found
        )
        lines.append(f"task {raw_text(task.id)}: {said}")
    if len(odd) > WARN_TASKS:
        lines.append(f"and {len(odd) - WARN_TASKS} more task(s) like these")
    return lines


def warn_odd(tasks: Sequence[Task]) -> None:
    """On stderr, what `odd_lines` says, and that another client wrote it."""
    lines = odd_lines(tasks)
    for line in lines:
        print(f"cairnqd: warning: {line}", file=sys.stderr)
    if lines:
        print(
            "cairnqd: warning: another client (an SDK, hand-written SQL) stored what these "
            f"columns hold; shown as stored, marked {UNREADABLE}",
            file=sys.stderr,
        )


def json_row(task: Task) -> dict[str, Any]:
    """A task as JSON output shows it: each column that holds what its readers cannot
    take as `{"undecodable": why, "raw": text}`, as an undecodable JSON value shows
    (`shown`); a JSON value left to `shown_json`."""
    data = dataclasses.asdict(task)
    for column, why in odd_values(task):
        value = data[column]
        if column in JSON_COLUMNS or isinstance(value, UndecodableText):
            continue  # shown as they always were: a marker, escaped text
        if column in MS_COLUMNS and is_int(value):
            continue  # a number, if no date: valid JSON as it is
        data[column] = {"undecodable": why, "raw": raw_text(value)}
    return data


# -- list --------------------------------------------------------------------------------


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
    the last attempt. "-" for a task still waiting; unreadable when a time it needs is
    not an integer."""
    completed = task.completed_at_ms
    ends = completed is not None or task.status == "running"
    if ends and not (is_int(task.run_at_ms) and (completed is None or is_int(completed))):
        return UNREADABLE
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
        [text_value(t.id), text_value(t.queue), text_value(t.name), status_text(t.status),
         attempts_text(t.attempt, t.max_attempts), number(t.priority), clock(t.created_at_ms),
         clock(t.run_at_ms), duration(t, now_ms), _row_error(t)]
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
    attempt = attempts_text(task.attempt, task.max_attempts)
    parts = [time.strftime("%H:%M:%S"), status_text(task.status), f"attempt {attempt}"]
    if task.progress is not None:
        parts.append(f"progress {progress_text(task.progress)}")
    if task.message:
        parts.append(text_value(task.message))
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
    print(f"task {text_value(task.id)} {status_text(task.status)}", file=sys.stderr)
    return 1
