"""A Postgres claim sent in one flight (cairnqd/store/postgres/flight.py) whose caller
is cancelled after the flight left: the server commits the claim all the same, so its
tasks must come back to the queue at once, attempt restored, not after their lease."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from cairnqd import CairnQ
from cairnqd.store.postgres import PostgresStore
from tests.faults.proxy import FaultProxy
from tests.support.waiting import wait_for_async

#: Each way, so a round trip through the proxy takes twice this.
DELAY_S = 0.3


def task_row(dsn: str, task_id: str) -> tuple[Any, ...]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "select status, attempt, worker_id, lease_until_ms from cairnq_tasks where id = %s",
            (task_id,),
        ).fetchone()
        assert row is not None
        return tuple(row)


async def test_a_claim_cancelled_after_its_flight_left_hands_its_tasks_back(
    pg_proxy: FaultProxy, pg_dsn: str
) -> None:
    async with CairnQ(PostgresStore(pg_dsn)) as direct:
        first = await direct.submit("demo.echo", {})
        second = await direct.submit("demo.echo", {})
    store = PostgresStore(pg_proxy.dsn(pg_dsn), listen=False)
    await store.connect()
    try:
        # A first claim recovers expired leases, as a claim does once a second; with
        # that done, the next claim (one draw, nothing to wait on) goes in one flight.
        claimed = await store.claim(queues=["default"], worker_id="w-flight")
        assert [t.id for t in claimed] == [first.id]
        store.claim_recovery_every_s = 3600
        pg_proxy.delay(DELAY_S)
        claiming = asyncio.ensure_future(store.claim(queues=["default"], worker_id="w-flight"))
        # The flight reached the server and committed; its answer is still on the way.
        await wait_for_async(
            "the flight's commit", lambda: task_row(pg_dsn, second.id)[0] == "running"
        )
        assert not claiming.done()
        claiming.cancel()
        with pytest.raises(asyncio.CancelledError):
            await claiming
        status, attempt, worker_id, lease = task_row(pg_dsn, second.id)
        assert (status, attempt, worker_id, lease) == ("queued", 0, None, None)
        # The first task, claimed before and never settled, is untouched.
        assert task_row(pg_dsn, first.id)[:3] == ("running", 1, "w-flight")
    finally:
        pg_proxy.forward()
        await store.close()
