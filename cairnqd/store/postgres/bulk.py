"""`submit_many` on Postgres for long lists: each run of keyless items is one COPY
stream, sent a few dozen rows at a time while the client checks the next
(docs/architecture.md, "Long submit_many lists").
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.copy import AsyncLibpqWriter

from cairnqd._protocol import statement
from cairnqd.models import Task
from cairnqd.store.arguments import Params
from cairnqd.store.base import inserted_tasks, prepare_items
from cairnqd.store.bulk import SubmitKeyed, insert_in_runs
from cairnqd.store.postgres.connect import AsyncConn
from cairnqd.store.statement_params import task_rows

#: A list longer than this is streamed; a shorter one is a single `insert_many`, one
#: round trip where a stream takes three (the clock, the COPY, its end).
STREAM_FROM = 200
#: Items checked, encoded and sent at a time; the event loop gets a turn between two
#: steps, so a long list never holds it for long (~0.5 ms of work).
STREAM_STEP = 50


async def stream_tasks(
    conn: AsyncConn,
    items: Sequence[Mapping[str, Any]],
    ids: Sequence[str],
    now_ms: int,
    submit_keyed: SubmitKeyed,
) -> list[Task]:
    """Insert `items` (item i under `ids[i]`) inside the transaction open on `conn`,
    stamped `now_ms`, and return their tasks in list order: runs of keyless items
    streamed, keyed items through `submit_keyed` (store/bulk.py)."""

    async def copy_run(start: int, stop: int) -> list[Task]:
        return await _copy_run(conn, items, ids, start, stop, now_ms)

    return await insert_in_runs(items, ids, copy_run, submit_keyed)


async def _copy_run(
    conn: AsyncConn,
    items: Sequence[Mapping[str, Any]],
    ids: Sequence[str],
    start: int,
    stop: int,
    now_ms: int,
) -> list[Task]:
    out: list[Task] = []
    cursor = conn.cursor()
    writer = AsyncLibpqWriter(cursor, flush_threshold=0)  # send every step at once
    async with cursor.copy(statement("postgres", "insert_copy").text, writer=writer) as copy:
        for at in range(start, stop, STREAM_STEP):
            run = prepare_items(items, ids, at, min(stop, at + STREAM_STEP))
            await copy.write(copy_rows(run, now_ms))
            out += inserted_tasks(run, now_ms)
            await asyncio.sleep(0)
    # Leaving the block ended the COPY and waited for the server to take every row.
    return out


# COPY's text format: a backslash starts an escape, a tab ends a field, a newline or a
# carriage return ends a row, so those four are escaped; NULL is \N.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_ROW = "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%d\t%d\t%d\tqueued\n"


def copy_field(text: str) -> str:
    """A text value as one field of COPY's text format (NULL is written \\N)."""
    # Printable text has no tab, newline or carriage return: only a backslash to find.
    if text.isprintable() and "\\" not in text:
        return text
    return text.translate(_COPY_ESCAPES)


def _json_field(text: str) -> str:
    # ASCII-escaped JSON has no control characters; its own escapes start with a
    # backslash, which COPY reads as one of its own unless doubled.
    return text.replace("\\", "\\\\") if "\\" in text else text


def copy_rows(run: Sequence[Params], now_ms: int) -> str:
    """COPY text for insert_copy.sql's columns: each task's `task_rows` values (the
    row SQLite's insert_many binds, in the same order), then its status, queued."""
    field = copy_field
    lines: list[str] = []
    add = lines.append
    for row in task_rows(run, now_ms):
        task_id, name, queue, payload, metadata, max_attempts, priority = row[:7]
        parent_id, root_id, correlation_id, run_at_ms, created_at_ms, updated_at_ms = row[7:]
        add(
            _ROW
            % (
                task_id,  # an id this client made: Crockford characters only
                field(name),
                field(queue),
                _json_field(payload),
                _json_field(metadata),
                max_attempts,
                priority,
                "\\N" if parent_id is None else field(parent_id),
                task_id if root_id == task_id else field(root_id),
                "\\N" if correlation_id is None else field(correlation_id),
                run_at_ms,
                created_at_ms,
                updated_at_ms,
            )
        )
    return "".join(lines)


__all__ = ["STREAM_FROM", "STREAM_STEP", "copy_field", "copy_rows", "stream_tasks"]
