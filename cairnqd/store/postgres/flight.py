"""A claim transaction sent in one flight: BEGIN, its statements and COMMIT pipelined.

Sent one at a time, a claim costs three round trips (BEGIN, the claim, COMMIT) and a
turn of the event loop for each; under a steady stream that was most of the time
between a task's commit and its handler's start (bench/RESULTS.md, "Under a steady
stream"). When nothing in the transaction waits on what an earlier statement returned
(one draw, at most one concurrency budget of a flow-control limit, recovery not due:
`TaskStore._claim_at_once`), the whole of it goes out together with psycopg's pipeline
mode and its answers come back together.

The flight's BEGIN and COMMIT are left out when nothing else leads it (no DISCARD
PLANS due): in the extended query protocol, the statements a client sends before one
Sync run in one implicit transaction, committed at the Sync, and a pipeline sends its
Sync when it ends. The connections are in autocommit mode, so psycopg adds no BEGIN of
its own. A statement that fails skips the rest and the Sync ends the transaction
rolled back, as an explicit one would be.

What that costs is the ROLLBACK a cancelled caller relied on: once sent, the COMMIT
runs whether or not anyone waits for it. So the flight runs in a task of its own that a
cancellation does not reach (`claim_in_one_flight`); a cancelled caller waits up to
`FLIGHT_HAND_BACK_S` for its answer, then hands what it claimed back as never started
(`return_unstarted`: queued again, attempt restored) before the cancellation goes on.
A flight with no answer by then (a server that stopped answering) is abandoned, and
what it may have claimed comes back when its leases expire, as a claim whose COMMIT
went unanswered always did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import pq

from cairnqd._jsoncodec import dump_json
from cairnqd._protocol import Statement, statement
from cairnqd.store.executor import Row
from cairnqd.store.postgres.connect import AsyncConn, bind, returned_rows, run
from cairnqd.store.reachability import FLIGHT_HAND_BACK_S

log = logging.getLogger("cairnqd.store")

Step = tuple[Statement, Mapping[str, Any]]


async def claim_in_one_flight(
    conn: AsyncConn,
    begin: Sequence[str],
    steps: Sequence[Step],
    worker_id: str,
    clock: Any,
) -> list[list[Row]]:
    """Run `begin`, then `steps`, then COMMIT on `conn` in one flight: each step's rows.
    The last step is the claim; if the caller is cancelled meanwhile, its rows are
    handed back (module docstring) before the cancellation propagates. With no `begin`,
    no COMMIT either: a single step goes alone, a transaction by itself, and several go
    in one pipeline, one implicit transaction."""
    flight = asyncio.ensure_future(_fly(conn, begin, steps, clock))
    try:
        return await asyncio.shield(flight)
    except asyncio.CancelledError:
        flight.add_done_callback(_retrieved)  # cancelled again meanwhile: never unread
        await _hand_back(flight, conn, worker_id)
        raise


def _retrieved(flight: asyncio.Future[list[list[Row]]]) -> None:
    if not flight.cancelled():
        flight.exception()


async def _fly(
    conn: AsyncConn, begin: Sequence[str], steps: Sequence[Step], clock: Any
) -> list[list[Row]]:
    if not begin and len(steps) == 1:
        # One statement with no transaction around it (`claim_in_one_flight`): it is its
        # own transaction on our autocommit connections, sent and answered without the
        # pipeline's bookkeeping.
        stmt, params = steps[0]
        cursor = await conn.execute(stmt.text, bind(stmt, params, clock))
        return [list(await cursor.fetchall()) if returned_rows(cursor) else []]
    cursors = []
    try:
        async with conn.pipeline():
            for text in begin:
                await conn.execute(text)
            for stmt, params in steps:
                cursors.append(await conn.execute(stmt.text, bind(stmt, params, clock)))
            if begin:
                await conn.execute("commit")
    except psycopg.Error:
        # A failed statement skips the rest up to the pipeline's end, COMMIT with them,
        # and leaves the transaction aborted: end it, as a transaction sent one
        # statement at a time would have been.
        if not conn.closed and conn.info.transaction_status != pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                await conn.execute("rollback")
        raise
    return [list(await c.fetchall()) if returned_rows(c) else [] for c in cursors]


async def _hand_back(
    flight: asyncio.Future[list[list[Row]]], conn: AsyncConn, worker_id: str
) -> None:
    """The caller was cancelled with the flight sent: wait for what it claimed and give
    it back unstarted. Never raises: the cancellation is what the caller will see."""
    try:
        async with asyncio.timeout(FLIGHT_HAND_BACK_S):
            # A limited draw's answer may hold a row of nulls besides the tasks.
            claimed = [row for row in (await asyncio.shield(flight))[-1] if row["id"] is not None]
            if claimed:
                items = [{"id": row["id"], "a": row["attempt"]} for row in claimed]
                params = {"worker_id": worker_id, "unstarted": dump_json(items)}
                await run(conn, statement("postgres", "extensions/return_unstarted"), params)
    except Exception as exc:  # a timeout included: the flight is abandoned
        if not flight.done():
            flight.cancel()
            with contextlib.suppress(BaseException):
                await flight
        elif not flight.cancelled() and flight.exception() is not None:
            return  # it failed: nothing was claimed
        log.warning(
            "a claim by %s was cancelled after it was sent and could not be handed back "
            "(%s); what it took returns to its queue when the leases expire",
            worker_id,
            exc,
        )
