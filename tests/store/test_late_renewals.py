"""A renewal that reaches its row late: the worker's `renew_leases` on Postgres.

A renewal takes its time from `now()`, the start of its transaction: when the statement
arrived, before it waited for a lock. One that waited behind another client's lock
(a `LOCK TABLE`, a long transaction on the row) is applied with a "now + lease" from the
past. Meanwhile a later claim or renewal may have written a lease further out, which
the worker counts on. Both cases here hold the row with `select ... for update` from a
second session while the renewal waits, apply the later write from that session, and
let the renewal through.

Before, the worker renewed by ids (`heartbeat_batch`): a renewal sent for attempt 1
renewed attempt 2, which the same worker had claimed meanwhile, with a lease already
over; recovery handed the task out again while attempt 2 ran (a third execution beside
the second).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import psycopg
import pytest

from cairnqd.store.postgres.store import PostgresStore
from tests.support.databases import PgDatabases
from tests.support.waiting import wait_for_async

LATE_LEASE_MS = 1000  # the late renewal's lease: over by the time it is applied


@pytest.fixture
async def pg_store(pg_databases: PgDatabases) -> AsyncIterator[tuple[PostgresStore, str]]:
    dsn = pg_databases.new(migrated=True)
    store = PostgresStore(dsn, max_size=2)
    await store.connect()
    try:
        yield store, dsn
    finally:
        await store.close()


async def _renew_late(
    store: PostgresStore, dsn: str, task_id: str, attempt: int, later_write: str
) -> tuple[dict[str, tuple[int, bool]], int]:
    """Send a renewal of (`task_id`, `attempt`) while another session holds the row; once
    the renewal's lease would be over, apply `later_write` (SQL with `%(id)s` and
    `%(lease)s`, a lease a minute out) from that session and let the renewal through.
    The renewal's reply, and the lease the later write gave."""
    async with await psycopg.AsyncConnection.connect(dsn) as holder:
        await holder.execute("select id from cairnq_tasks where id = %s for update", [task_id])
        sent = time.monotonic()
        renewal = asyncio.create_task(
            store.renew_leases(held=[(task_id, attempt)], worker_id="w", lease_ms=LATE_LEASE_MS)
        )

        async def waiting_on_the_row() -> bool:
            cur = await holder.execute(
                "select count(*) from pg_stat_activity"
                " where datname = current_database() and wait_event_type = 'Lock'"
            )
            row = await cur.fetchone()
            return row is not None and row[0] > 0

        await wait_for_async("the renewal to wait on the row lock", waiting_on_the_row)
        await wait_for_async(
            "the late renewal's lease to be over",
            lambda: time.monotonic() > sent + LATE_LEASE_MS / 1000 * 1.5,
        )
        cur = await holder.execute(
            "select (extract(epoch from clock_timestamp()) * 1000)::bigint + 60000"
        )
        row = await cur.fetchone()
        assert row is not None
        lease = int(row[0])
        await holder.execute(later_write, {"id": task_id, "lease": lease})  # type: ignore[arg-type]
        await holder.commit()
    return await asyncio.wait_for(renewal, 30), lease


async def _lease_of(store: PostgresStore, task_id: str) -> tuple[int, int | None]:
    task = await store.get(task_id)
    assert task is not None
    return task.attempt, task.lease_until_ms


async def test_a_late_renewal_does_not_touch_the_attempt_claimed_since(
    pg_store: tuple[PostgresStore, str],
) -> None:
    store, dsn = pg_store
    task = await store.submit(name="long", payload={}, max_attempts=3)
    (claimed,) = await store.claim(queues=["default"], worker_id="w", lease_ms=60_000)
    assert claimed.attempt == 1
    # Meanwhile attempt 1's lease ended, recovery requeued the task, and the same worker
    # claimed it again as attempt 2.
    reply, lease = await _renew_late(
        store, dsn, task.id, 1,
        "update cairnq_tasks set attempt = 2, lease_until_ms = %(lease)s where id = %(id)s",
    )  # fmt: skip
    assert reply == {}, "a renewal sent for attempt 1 renewed attempt 2"
    assert await _lease_of(store, task.id) == (2, lease)


async def test_a_late_renewal_does_not_move_a_lease_earlier(
    pg_store: tuple[PostgresStore, str],
) -> None:
    store, dsn = pg_store
    task = await store.submit(name="long", payload={})
    await store.claim(queues=["default"], worker_id="w", lease_ms=60_000)
    # Meanwhile a later renewal of the same attempt went through first.
    reply, lease = await _renew_late(
        store, dsn, task.id, 1,
        "update cairnq_tasks set lease_until_ms = %(lease)s where id = %(id)s",
    )  # fmt: skip
    assert reply == {task.id: (1, False)}
    assert await _lease_of(store, task.id) == (1, lease)
