"""A worker keeping up with a steady stream claims a few tasks every few milliseconds:
what each claim does on the way to the handler (store/base.py, `_claim_in`;
store/postgres/store.py, `_take_push_hint`) without losing expired leases or wake-ups.
Real databases, real notifications."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cairnqd.store.base import CLAIM_RECOVERY_EVERY_S, Params, Row, TaskStore
from cairnqd.store.postgres import PostgresStore
from tests.support.databases import PgDatabases, make_store
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.timeout(60)


async def lease_passed(store: TaskStore, task_id: str) -> None:
    task = await store.get(task_id)
    assert task is not None and task.lease_until_ms is not None
    until = task.lease_until_ms

    async def passed() -> bool:
        return await store.database_now_ms() > until

    await wait_for_async("the lease to expire", passed, timeout=10)


async def test_a_claim_keeping_up_with_a_stream_still_recovers_expired_leases(
    store: TaskStore,
) -> None:
    """Claims that each find a task skip the recovery scan, except once a second: a
    dead worker's task comes back within that pace, not only when the stream stops."""
    dead = await store.submit(name="job", queue="q")
    assert [t.id for t in await store.claim(queues=["q"], worker_id="dead", lease_ms=50)] == [
        dead.id
    ]
    await lease_passed(store, dead.id)
    started = time.monotonic()
    seen: set[str] = set()
    while dead.id not in seen:
        assert time.monotonic() - started < 5 * CLAIM_RECOVERY_EVERY_S, "never recovered"
        await store.submit(name="job", queue="q")
        claimed = await store.claim(queues=["q"], worker_id="alive", limit=4)
        assert claimed, "a claim with a task queued found nothing"
        seen.update(t.id for t in claimed)
    task = await store.get(dead.id)
    assert task is not None and task.worker_id == "alive" and task.attempt == 2


async def test_an_empty_claim_recovers_at_once(store: TaskStore) -> None:
    dead = await store.submit(name="job", queue="q")
    await store.claim(queues=["q"], worker_id="dead", lease_ms=50)
    await lease_passed(store, dead.id)
    # Within the second since the last recovery (the dead worker's claim ran one), a
    # claim that draws nothing still recovers at once and draws again (past the short
    # gap that spares a burst of empty claims: `EMPTY_CLAIM_RECOVERY_GAP_S`).
    store.empty_claim_recovery_gap_s = 0.0
    claimed = await store.claim(queues=["q"], worker_id="alive", limit=4)
    assert [t.id for t in claimed] == [dead.id]


@pytest.fixture
async def pg_pair(pg_databases: PgDatabases) -> AsyncIterator[tuple[PostgresStore, TaskStore]]:
    target = pg_databases.new()
    worker, client = make_store("postgres", target), make_store("postgres", target)
    assert isinstance(worker, PostgresStore)
    await worker.connect()
    await client.connect()
    try:
        yield worker, client
    finally:
        await worker.close()
        await client.close()


@pytest.mark.postgres
async def test_a_claim_after_a_notification_skips_its_probe_and_one_without_does_not(
    pg_pair: tuple[PostgresStore, TaskStore],
) -> None:
    """Claims back to back never wait in claim_wake: a notification that came since
    the last claim began is still the hint that spares the probe, once."""
    worker, client = pg_pair
    probes = 0
    fetch = worker._fetch

    async def counting(
        op: str, params: Params, supplied: frozenset[str] = frozenset()
    ) -> list[Row]:
        nonlocal probes
        probes += op == "claimable_probe"
        return await fetch(op, params, supplied)

    worker._fetch = counting  # type: ignore[method-assign]
    assert await worker.claim(queues=["q"], worker_id="w") == []  # starts the LISTEN
    assert probes == 1
    listener = worker._listeners["cairnq_queued"]
    await listener.until_listening(10)
    flag = listener.sticky(["q"])[0]
    submitted = await client.submit(name="job", queue="q")
    await wait_for_async("the notification", flag.is_set, timeout=10)
    claimed = await worker.claim(queues=["q"], worker_id="w")
    assert [t.id for t in claimed] == [submitted.id]
    assert probes == 1, "a claim after a notification probed first"
    assert not flag.is_set()
    # No notification since: the next claim looks before it opens anything.
    assert await worker.claim(queues=["q"], worker_id="w") == []
    assert probes == 2


@pytest.mark.postgres
async def test_empty_claims_close_together_recover_once(
    pg_pair: tuple[PostgresStore, TaskStore],
) -> None:
    """A claim that a notification sent and that finds nothing (another worker took the
    task) recovers expired leases, unless a claim of this store did within
    `empty_claim_recovery_gap_s`: the daemon's children all wake for each notification,
    and the losers' recoveries were a third of their cost."""
    worker, client = pg_pair
    recoveries = 0
    recover_in = worker._recover_in

    async def counting(*args: Any) -> bool:
        nonlocal recoveries
        recoveries += 1
        return await recover_in(*args)

    worker._recover_in = counting  # type: ignore[method-assign,assignment]
    await client.submit(name="job", queue="q")
    assert len(await worker.claim(queues=["q"], worker_id="w")) == 1
    assert recoveries == 1  # the first claim's, due
    worker.claim_recovery_every_s = 3600
    assert await worker.claim(queues=["q"], worker_id="w") == []  # starts the LISTEN
    listener = worker._listeners["cairnq_queued"]
    await listener.until_listening(10)
    flag = listener.sticky(["q"])[0]

    async def lost_to_another() -> list[str]:
        taken = await client.submit(name="job", queue="q")
        assert [t.id for t in await client.claim(queues=["q"], worker_id="other")] == [taken.id]
        await wait_for_async("the notification", flag.is_set, timeout=10)
        return [t.id for t in await worker.claim(queues=["q"], worker_id="w")]

    worker.empty_claim_recovery_gap_s = 3600
    assert await lost_to_another() == []
    assert recoveries == 1, "an empty claim within the gap recovered"
    worker.empty_claim_recovery_gap_s = 0.0
    assert await lost_to_another() == []
    assert recoveries == 2, "an empty claim past the gap did not recover"
