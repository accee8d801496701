"""Owned writes that reach their row late, on Postgres: the worker's renewals, results,
failures and progress.

A write takes its time from `now()`, the start of its transaction: when the statement
arrived, before it waited for a lock. One that waited behind another client's lock
(a `LOCK TABLE`, a long transaction on the row) is applied with a "now" from the past,
and meanwhile the lease it was sent under may have ended, the task been recovered and
the same worker claimed it again: the row is running, owned by the same worker id,
under a lease that passes the stale "now". Each case here holds the row with
`select ... for update` from a second session while the write waits, applies what
happened meanwhile from that session, and lets the write through.

Before, the worker's writes named the task and worker only. A renewal sent for attempt
1 renewed attempt 2 with a lease already over, and a failure of attempt 1 put attempt 2
back in the queue while it ran: either way recovery handed the task out again beside
the running attempt. A renewal could also move a lease earlier than a later renewal had
put it, which the worker counted on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import psycopg
import pytest

from cairnqd.errors import LostLease
from cairnqd.store.postgres.store import PostgresStore
from tests.support.databases import PgDatabases
from tests.support.waiting import wait_for_async

LATE_LEASE_MS = 1000  # a lease from the late write's sending: over when it is applied


@pytest.fixture
async def pg_store(pg_databases: PgDatabases) -> AsyncIterator[tuple[PostgresStore, str]]:
    dsn = pg_databases.new(migrated=True)
    store = PostgresStore(dsn, max_size=2)
    await store.connect()
    try:
        yield store, dsn
    finally:
        await store.close()


T = TypeVar("T")

#: Meanwhile attempt 1's lease ended, recovery requeued the task, and the same worker
#: claimed it again as attempt 2.
CLAIMED_AGAIN = "update cairnq_tasks set attempt = 2, lease_until_ms = %(lease)s where id = %(id)s"


async def _late(
    dsn: str, task_id: str, write: Callable[[], Awaitable[T]], later_write: str
) -> tuple[T | BaseException, int]:
    """Send `write` while another session holds the row; once a lease of
    `LATE_LEASE_MS` from its sending would be over, apply `later_write` (SQL with
    `%(id)s` and `%(lease)s`, a lease a minute out) from that session and let `write`
    through. What `write` returned or raised, and the lease the later write gave."""
    async with await psycopg.AsyncConnection.connect(dsn) as holder:
        await holder.execute("select id from cairnq_tasks where id = %s for update", [task_id])
        sent = time.monotonic()
        late = asyncio.create_task(write())

        async def waiting_on_the_row() -> bool:
            cur = await holder.execute(
                "select count(*) from pg_stat_activity"
                " where datname = current_database() and wait_event_type = 'Lock'"
            )
            row = await cur.fetchone()
            return row is not None and row[0] > 0

        await wait_for_async("the write to wait on the row lock", waiting_on_the_row)
        await wait_for_async(
            "a lease from the write's sending to be over",
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
    try:
        return await asyncio.wait_for(late, 30), lease
    except Exception as exc:
        return exc, lease


async def _lease_of(store: PostgresStore, task_id: str) -> tuple[str, int, int | None]:
    task = await store.get(task_id)
    assert task is not None
    return task.status, task.attempt, task.lease_until_ms


async def _claimed(store: PostgresStore) -> str:
    task = await store.submit(name="long", payload={}, max_attempts=3)
    (claimed,) = await store.claim(queues=["default"], worker_id="w", lease_ms=60_000)
    assert (claimed.id, claimed.attempt) == (task.id, 1)
    return task.id


#: What happened while a renewal of attempt 1 waited: (the write applied meanwhile,
#: whether the renewal then renews, the attempt the row is left at).
MEANWHILE = {
    "claimed again": (CLAIMED_AGAIN, False, 2),
    "renewed further": (
        "update cairnq_tasks set lease_until_ms = %(lease)s where id = %(id)s",
        True,
        1,
    ),
}


@pytest.mark.parametrize("meanwhile", MEANWHILE)
async def test_a_late_renewal_renews_only_its_attempt_and_never_moves_a_lease_earlier(
    pg_store: tuple[PostgresStore, str], meanwhile: str
) -> None:
    store, dsn = pg_store
    later_write, renews, attempt = MEANWHILE[meanwhile]
    task_id = await _claimed(store)
    reply, lease = await _late(
        dsn, task_id,
        lambda: store.renew_leases(held=[(task_id, 1)], worker_id="w", lease_ms=LATE_LEASE_MS),
        later_write,
    )  # fmt: skip
    assert reply == ({task_id: (1, False)} if renews else {})
    # Before: attempt 2 renewed with a lease already over, or the lease moved back.
    assert await _lease_of(store, task_id) == ("running", attempt, lease)


LATE_WRITES: dict[str, Callable[[PostgresStore, str], Awaitable[object]]] = {
    "fail": lambda s, i: s.fail(task_id=i, worker_id="w", error={"message": "x"}, attempt=1),
    "complete": lambda s, i: s.complete(task_id=i, worker_id="w", result=1, attempt=1),
    "succeed": lambda s, i: s.succeed(task_id=i, worker_id="w", result=1, attempt=1),
    "progress": lambda s, i: s.progress(
        task_id=i, worker_id="w", progress=0.5, message=None, attempt=1
    ),
}


@pytest.mark.parametrize("op", LATE_WRITES)
async def test_a_late_write_for_one_attempt_leaves_the_next_alone(
    pg_store: tuple[PostgresStore, str], op: str
) -> None:
    store, dsn = pg_store
    task_id = await _claimed(store)
    outcome, lease = await _late(
        dsn, task_id, lambda: LATE_WRITES[op](store, task_id), CLAIMED_AGAIN
    )
    assert isinstance(outcome, LostLease), outcome
    assert await _lease_of(store, task_id) == ("running", 2, lease)
    task = await store.get(task_id)
    assert task is not None and task.progress is None and task.error is None


async def test_without_an_attempt_a_late_failure_settles_the_next_attempt(
    pg_store: tuple[PostgresStore, str],
) -> None:
    """The protocol's owned writes name no attempt (the public SDK's are the same): what
    the worker's writes now avoid."""
    store, dsn = pg_store
    task_id = await _claimed(store)
    outcome, _ = await _late(
        dsn, task_id,
        lambda: store.fail(task_id=task_id, worker_id="w", error={"message": "x"}),
        CLAIMED_AGAIN,
    )  # fmt: skip
    assert not isinstance(outcome, BaseException)
    assert (await _lease_of(store, task_id))[:2] == ("queued", 2)
