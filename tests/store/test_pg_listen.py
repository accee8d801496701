"""Postgres push wake-ups: one LISTEN connection per channel, opened on first need.

A worker listens on `cairnq_queued` only, so it is not sent a notification for
every task it completes; a waiter listens on `cairnq_done` only. A dropped LISTEN
connection reconnects and pushes again; while it is down, waits fall back to
their own poll timeouts.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

from cairnqd.client import CairnQ
from cairnqd.store.postgres import PostgresStore
from cairnqd.worker import Worker
from tests.support.databases import require_postgres
from tests.support.worker import (
    IdleProbe,
    eventually,
    pg_listen_queries,
    running,
    wait_all,
    wrap_method,
)

pytestmark = pytest.mark.timeout(60)


def terminate_listeners(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity "
            "where datname = current_database() and pid <> pg_backend_pid() "
            "and query ilike 'listen %'"
        ).fetchall()
    return len(rows)


async def queued_listener_connected(store: PostgresStore) -> None:
    """Open the store's cairnq_queued listener (as a worker's first claim would) and
    wait until its LISTEN is in place."""
    listener = store._push("cairnq_queued")
    assert listener is not None
    await eventually(listener.connected.is_set, what="the cairnq_queued LISTEN")


@pytest.fixture
async def pg_store(pg_dsn: str) -> Any:
    require_postgres()
    store = PostgresStore(pg_dsn, max_size=4)
    await store.connect()
    try:
        yield store
    finally:
        await store.close()


async def test_a_worker_listens_for_queued_work_only(pg_store: PostgresStore, pg_dsn: str) -> None:
    client = CairnQ(pg_store)
    worker = Worker(pg_store, ["default"], concurrency=4, poll_interval_ms=5000)

    @worker.task
    async def job(ctx: Any) -> None:
        return None

    tasks = await client.submit_many([{"name": "job"} for _ in range(50)])
    async with running(worker):
        await wait_all(pg_store, [t.id for t in tasks], "succeeded")
        await eventually(
            lambda: asyncio.to_thread(pg_listen_queries, pg_dsn), what="the worker's LISTEN"
        )
        assert await asyncio.to_thread(pg_listen_queries, pg_dsn) == ['listen "cairnq_queued"']


@pytest.mark.timing
async def test_a_waiter_listens_for_done_and_wakes_at_once(
    pg_store: PostgresStore, pg_dsn: str
) -> None:
    client = CairnQ(pg_store)
    other = PostgresStore(pg_dsn, max_size=2, listen=False)
    await other.connect()
    try:
        task = await client.submit("job")
        claimed = await other.claim(queues=["default"], worker_id="w1", lease_ms=30_000)
        assert [t.id for t in claimed] == [task.id]

        async def finish_while_waited_on() -> None:
            def waiting() -> bool:
                done = pg_store._listeners.get("cairnq_done")
                return done is not None and task.id in done._waiters

            await eventually(waiting, what="the waiter on the cairnq_done channel")
            await other.complete(task_id=task.id, worker_id="w1", result={"ok": True})

        finisher = asyncio.create_task(finish_while_waited_on())
        started = time.monotonic()
        # A 20 s poll: only the push can make this quick.
        done = await client.wait(task.id, timeout_ms=30_000, poll_ms=20_000, max_poll_ms=20_000)
        waited = time.monotonic() - started
        await finisher
    finally:
        await other.close()
    assert done.status == "succeeded" and done.result == {"ok": True}
    assert waited < 5.0
    assert await asyncio.to_thread(pg_listen_queries, pg_dsn) == ['listen "cairnq_done"']


@pytest.mark.timing
async def test_a_dropped_listen_connection_reconnects_and_pushes_again(
    pg_store: PostgresStore, pg_dsn: str
) -> None:
    client = CairnQ(pg_store)
    started: dict[str, float] = {}
    worker = Worker(pg_store, ["default"], poll_interval_ms=20_000)

    @worker.task
    async def job(ctx: Any) -> None:
        started[ctx.task_id] = time.monotonic()

    async with running(worker):
        await eventually(
            lambda: asyncio.to_thread(pg_listen_queries, pg_dsn), what="the worker's LISTEN"
        )
        assert await asyncio.to_thread(terminate_listeners, pg_dsn) == 1

        async def relistening() -> bool:
            return bool(await asyncio.to_thread(pg_listen_queries, pg_dsn))

        await eventually(relistening, what="the LISTEN connection to come back")
        # From here a NOTIFY reaches the worker's sticky wake flag wherever it is.
        await eventually(
            pg_store._listeners["cairnq_queued"].connected.is_set, what="the listener to reconnect"
        )
        submitted = time.monotonic()
        task = await client.submit("job")
        await wait_all(pg_store, [task.id], "succeeded")
    # Well before the 20 s poll: the push works again.
    assert started[task.id] - submitted < 5.0


async def test_a_pushed_wake_claims_without_the_probe(pg_store: PostgresStore, pg_dsn: str) -> None:
    """The notification already says work was queued: the claim that follows skips its
    read-only probe (one round trip less between submit and handler)."""
    client = CairnQ(pg_store)
    ops: list[str] = []

    async def record(original: Any, op: str, *args: Any, **kwargs: Any) -> Any:
        ops.append(op)
        return await original(op, *args, **kwargs)

    wrap_method(pg_store, "_fetch", record)
    probe = IdleProbe(pg_store)
    worker = Worker(pg_store, ["default"], poll_interval_ms=20_000)

    @worker.task
    async def job(ctx: Any) -> None:
        ops.append("handler")

    # Listening before the worker starts: its first idle wait is already a push wait.
    await queued_listener_connected(pg_store)
    async with running(worker):
        await eventually(probe.idle.is_set, what="the worker's idle wait")
        ops.clear()
        task = await client.submit("job")
        await wait_all(pg_store, [task.id], "succeeded")
    # (The loop probes again after the task, on its way back to idle.)
    assert "claimable_probe" not in ops[: ops.index("handler")], ops


async def test_an_idle_listen_does_not_wake_its_loop_and_hears_the_next_notify(
    pg_store: PostgresStore,
) -> None:
    """A LISTEN with nothing to hear leaves the event loop asleep: it used to wait in
    psycopg's `notifies(timeout=...)`, which turns the loop every 100 ms. The count of
    the selector's waits cannot grow with a slow machine, only shrink. After the idle
    spell, the socket wait hands the next notification on."""
    await queued_listener_connected(pg_store)
    listener = pg_store._push("cairnq_queued")
    assert listener is not None
    [flag] = listener.sticky(["default"])
    flag.clear()
    loop = asyncio.get_running_loop()
    selector = loop._selector  # type: ignore[attr-defined]
    turns = 0
    select = selector.select

    def counted(timeout: float | None = None) -> Any:
        nonlocal turns
        turns += 1
        return select(timeout)

    selector.select = counted
    try:
        await asyncio.sleep(2.0)  # the idle spell measured, not a wait for something
    finally:
        selector.select = select
    # The sleep's own wake-up, and a little room; psycopg's wait made 20 or more.
    assert turns <= 4, f"{turns} loop turns in 2 s of idling"

    await CairnQ(pg_store).submit("job")
    await asyncio.wait_for(flag.wait(), 10.0)
