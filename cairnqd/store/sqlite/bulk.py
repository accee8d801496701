"""`submit_many` on SQLite for long lists: a run of keyless items inserted a step at a
time on the store's helper thread while the event loop checks the next step
(docs/architecture.md, "Long submit_many lists").
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cairnqd._protocol import Statement, statement
from cairnqd.models import Task
from cairnqd.store.base import inserted_tasks, prepare_items
from cairnqd.store.sqlite.statements import run_rows, stop_step
from cairnqd.store.statement_params import insert_rows

#: A list this long is pipelined; a shorter one is checked first, then inserted (a hop
#: to the thread and back costs ~0.1 ms).
PIPELINE_FROM = 200
#: The most rows a step inserts: `run_rows`'s largest statement.
STEP = 256
#: The longest the loop waits for the thread to take a step up.
HANDOVER_S = 0.002

#: Starts `step(*args)` on the store's helper thread (`SQLiteStore._off_loop`).
OffLoop = Callable[..., "asyncio.Future[Any]"]


async def insert_steps(
    conn: sqlite3.Connection,
    off_loop: OffLoop,
    items: Sequence[Mapping[str, Any]],
    ids: Sequence[str],
    span: tuple[int, int],
    now_ms: int,
) -> list[Task]:
    """Keyless `items[start:stop]` (`span`), item i under `ids[i]`, inserted inside the
    write transaction open on `conn`, stamped `now_ms`: their tasks in list order. A bad
    item raises, naming its index, once the step being inserted has ended (the
    connection is the thread's until then); the caller's rollback takes out the rest."""
    stmt = statement("sqlite", "insert_many")
    out: list[Task] = []
    inserting: asyncio.Future[None] | None = None
    try:
        for start, stop in steps(*span):
            run = prepare_items(items, ids, start, stop)
            values = insert_rows(run, now_ms)
            if inserting is not None:
                await asyncio.shield(inserting)
            begun = threading.Event()
            inserting = off_loop(_insert, begun, conn, stmt, values)
            begun.wait(HANDOVER_S)
            out += inserted_tasks(run, now_ms)
        if inserting is not None:
            await asyncio.shield(inserting)
    except BaseException:
        if inserting is not None:
            await stop_step(conn, inserting)
        raise
    return out


def steps(start: int, stop: int) -> list[tuple[int, int]]:
    """`[start, stop)` as spans of a power of two items, at most `STEP`, largest first:
    each is one statement."""
    out: list[tuple[int, int]] = []
    while start < stop:
        size = min(STEP, 1 << ((stop - start).bit_length() - 1))
        out.append((start, start + size))
        start += size
    return out


def _insert(
    begun: threading.Event, conn: sqlite3.Connection, stmt: Statement, values: Sequence[Any]
) -> None:
    begun.set()
    run_rows(conn, stmt, values)


__all__ = ["HANDOVER_S", "PIPELINE_FROM", "STEP", "insert_steps", "steps"]
