"""Running protocol statements on a `sqlite3` connection: binding, rows, retries."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any

from cairnqd._protocol import Statement, rows_text, statement
from cairnqd.store.base import Clock, Params, Row


def bind(stmt: Statement, params: Mapping[str, Any], clock: Clock) -> dict[str, Any]:
    """Derive the absolute times this statement names, once, at bind time."""
    now = clock()
    bound: dict[str, Any] = {}
    for name in stmt.params:
        if name == "now_ms":
            bound[name] = now
        elif name == "lease_until_ms":
            bound[name] = now + int(params["lease_ms"]) + _lease_lead_ms(clock)
        elif name == "run_at_ms":
            bound[name] = now + int(params.get("delay_ms", 0))
        elif name == "before_ms":
            bound[name] = now - int(params.get("older_than_ms", 0))
        else:
            value = params.get(name)
            if isinstance(value, list | tuple):
                value = json.dumps(list(value))
            elif isinstance(value, bool):
                value = int(value)
            bound[name] = value
    return bound


def _lease_lead_ms(clock: Clock) -> int:
    """A clock riding out a wall-clock step (`store/clockstep.py`) reads behind the wall
    clock for a while; a lease written then must still end by the wall clock."""
    lead = getattr(clock, "lease_lead_ms", None)
    return 0 if lead is None else int(lead())


def run(
    conn: sqlite3.Connection, stmt: Statement, params: Mapping[str, Any], clock: Clock
) -> list[Row]:
    """Run one statement to completion; its rows as dicts. A row statement takes its
    values, flat, in `params["values"]` (see `run_rows`)."""
    if stmt.row_width:
        run_rows(conn, stmt, params["values"])
        return []
    cursor = conn.execute(stmt.text, bind(stmt, params, clock))
    try:
        rows = cursor.fetchall()
    except BaseException:
        # A fetch that failed part way (text that is not UTF-8) leaves its statement
        # active while the error lives, and an active statement blocks COMMIT.
        cursor.close()
        raise
    if not rows:
        return []
    columns = [d[0] for d in cursor.description]
    return [dict(zip(columns, row, strict=True)) for row in rows]


#: Rows one statement binds at most: enough to spread a statement's fixed cost thin,
#: well inside SQLite's limit on bound values (`_row_cap`).
_MAX_ROWS = 256


def run_rows(conn: sqlite3.Connection, stmt: Statement, values: Sequence[Any]) -> None:
    """Run row statement `stmt` for every row in `values` (`stmt.row_width` values per
    row, flat), in statements of a power of two rows each: any count then runs as a few
    statements from a handful of texts, which sqlite3 keeps prepared. All or nothing,
    as one statement would be: several run inside a savepoint (in autocommit, that is
    one transaction and one commit), rolled back if any of them fails."""
    width = stmt.row_width
    left, extra = divmod(len(values), width)
    if extra:
        raise ValueError(f"{stmt.name}: {len(values)} values are not rows of {width}")
    cap = _row_cap(conn, width)
    pieces = []
    while left:
        rows = min(cap, 1 << (left.bit_length() - 1))
        pieces.append(rows)
        left -= rows
    if len(pieces) == 1:
        conn.execute(rows_text(stmt, pieces[0]), values)
        return
    conn.execute("savepoint cairnqd_rows")
    try:
        at = 0
        for rows in pieces:
            conn.execute(rows_text(stmt, rows), values[at : at + rows * width])
            at += rows * width
    except BaseException:
        # An error that ended the whole transaction took the savepoint with it.
        with contextlib.suppress(sqlite3.Error):
            conn.execute("rollback to cairnqd_rows")
            conn.execute("release cairnqd_rows")
        raise
    conn.execute("release cairnqd_rows")


def _row_cap(conn: sqlite3.Connection, width: int) -> int:
    """The largest power of two of rows, at most `_MAX_ROWS`, whose values this SQLite
    binds in one statement (999 values before SQLite 3.32, 32,766 since)."""
    fits = min(_MAX_ROWS, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width)
    return 1 << (max(fits, 1).bit_length() - 1)


def is_read(stmt: Statement) -> bool:
    head = stmt.text.lstrip()[:6].lower()
    return head == "select" or (head.startswith("with") and "returning" not in stmt.text.lower())


async def stop_step(conn: sqlite3.Connection, step: asyncio.Future[Any]) -> None:
    """End early a statement that runs on the store's helper thread, and wait until it
    has ended: the connection is the thread's until then."""
    if not step.done():
        conn.interrupt()
    while not step.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({step})
    if not step.cancelled():
        step.exception()  # "interrupted", or the error the caller raises: reported there


def rollback(conn: sqlite3.Connection) -> None:
    # Never let a failed rollback replace the error that caused it.
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except Exception:
        pass


class SQLiteSession:
    """Statements inside one open write transaction."""

    def __init__(self, conn: sqlite3.Connection, clock: Clock) -> None:
        self._conn = conn
        self._clock = clock

    async def fetch(
        self, op: str, params: Params, supplied: frozenset[str] = frozenset()
    ) -> list[Row]:
        return run(self._conn, statement("sqlite", op, supplied), params, self._clock)

    async def fetch_statement(self, stmt: Statement, params: Params) -> list[Row]:
        return run(self._conn, stmt, params, self._clock)


class Backoff:
    """Jittered exponential waits for SQLITE_BUSY within a total budget.

    The cap is small on purpose. SQLite has no queue for its write lock: whoever asks
    the moment it is free wins. A process that just committed asks again within
    microseconds, so a rival backing off for tens of milliseconds almost never gets a
    turn (measured: 4 draining processes split 2,000 tasks 34/408/1558/0). And the
    lock stays unused from the moment it is freed until a waiter next asks: two
    draining workers each hold it for a few milliseconds per cycle, so a waiter at a
    4 ms cap left it idle for ~16% of the drain; at 1 ms the drain ran ~6% faster.

    Asking costs the waiter ~40 us of CPU a time (a failed BEGIN and the loop's
    wake-up around it): at 1 ms that is ~4% of a core per waiting process, fine for a
    few milliseconds, wasteful for a long write (an index build, a purge). So the cap
    is 1 ms for the first `_SHORT_S` of a wait, 4 ms after that (~1%).

    No awaited wait is shorter than about a millisecond: the loop's selector rounds a
    timeout up to whole milliseconds, so the first wait of 0.25-0.5 ms is one in
    practice. Sleeping the first millisecond on the loop's thread in 0.1 ms steps
    instead was tried: quicker at the median, slower at the tail, with a quarter more
    CPU for the BEGINs refused in between (bench/RESULTS.md, "Under a steady stream").
    """

    _FIRST_S = 0.0005
    _CAP_S = 0.001
    #: A wait longer than this is not another worker's cycle: ask less often.
    _SHORT_S = 0.025
    _LONG_CAP_S = 0.004

    def __init__(self, budget_ms: int) -> None:
        self._started = time.monotonic()
        self._deadline = self._started + budget_ms / 1000
        self._delay = self._FIRST_S

    def spent(self) -> bool:
        return time.monotonic() >= self._deadline

    async def sleep(self) -> None:
        await asyncio.sleep(random.uniform(self._delay / 2, self._delay))
        long = time.monotonic() - self._started > self._SHORT_S
        self._delay = min(self._delay * 2, self._LONG_CAP_S if long else self._CAP_S)


__all__ = ["Backoff", "SQLiteSession", "bind", "is_read", "rollback", "run", "run_rows"]
