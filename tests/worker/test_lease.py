"""docs/protocol.md §8.6, §8.8, #survivable-errors, #heartbeat-floor,
#abandon-hung-attempts, #sync-handlers-in-threads, #no-children-after-lease-loss:
heartbeats keep a lease, cancel and lease loss reach the handler, and `max_run_ms`
abandons a hung attempt."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.errors import LostLease
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.store import query
from tests.support.worker import (
    SQLITE_ONLY,
    ErrorLog,
    eventually,
    running,
    wait_status,
    wrap_method,
)

pytestmark = pytest.mark.timeout(60)


# -- heartbeats ------------------------------------------------------------------------


async def test_blocking_sync_handler_keeps_its_lease(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    """docs/protocol.md#sync-handlers-in-threads: a handler that blocks for 3+ leases must
    not be recovered and re-run."""
    worker = Worker(store, ["default"], lease_ms=600, poll_interval_ms=50, on_error=errors)
    runs: list[int] = []

    @worker.task
    def crunch(ctx: TaskContext) -> str:
        runs.append(ctx.attempt)
        time.sleep(2)
        return "crunched"

    task = await client.submit("crunch", max_attempts=3)
    async with running(worker):
        done = await wait_status(store, task.id)
    assert (done.status, done.result, done.attempt) == ("succeeded", "crunched", 1)
    assert runs == [1], "the task was redelivered while its handler still ran"
    assert not errors.calls, errors


async def test_heartbeat_renews_the_lease(store: TaskStore, client: CairnQ) -> None:
    worker = Worker(store, ["default"], lease_ms=300, poll_interval_ms=50)
    leases: list[int] = []
    release = asyncio.Event()

    @worker.task
    async def slow(ctx: TaskContext) -> None:
        await release.wait()

    task = await client.submit("slow")
    async with running(worker):

        async def renewed_twice() -> bool:
            row = await store.get(task.id)
            lease = None if row is None else row.lease_until_ms
            if lease is not None and (not leases or lease != leases[-1]):
                leases.append(lease)
            return len(leases) >= 3

        await eventually(renewed_twice, what="two lease renewals")
        release.set()
        done = await wait_status(store, task.id)
    assert leases == sorted(leases)
    assert (done.status, done.attempt) == ("succeeded", 1)


# -- cancellation --------------------------------------------------------------------


@pytest.mark.timing
async def test_cancel_reaches_a_running_handler(store: TaskStore, client: CairnQ) -> None:
    worker = Worker(store, ["default"], lease_ms=600, poll_interval_ms=50)
    started = asyncio.Event()
    saw_cancel: list[float] = []

    @worker.task
    async def long(ctx: TaskContext) -> str:
        started.set()
        while not await ctx.canceled():  # noqa: ASYNC110 - the cooperative check
            await asyncio.sleep(0.02)
        saw_cancel.append(time.monotonic())
        return "finished anyway"

    task = await client.submit("long")
    async with running(worker):
        await asyncio.wait_for(started.wait(), 20)
        asked = time.monotonic()
        row = await client.cancel(task.id)
        assert row is not None and row.status == "running" and row.cancel_requested
        done = await wait_status(store, task.id)
    assert saw_cancel and saw_cancel[0] - asked < 5.0
    assert done.status == "canceled"
    assert done.result is None, "cancel wins: the returned result is discarded"
    assert done.completed_at_ms is not None


async def test_heartbeat_carries_the_cancel_flag(store: TaskStore, client: CairnQ) -> None:
    """Once a beat saw the flag, `ctx.canceled()` answers without reading the row."""
    worker = Worker(store, ["default"], lease_ms=600, poll_interval_ms=50)
    started = asyncio.Event()
    beat_saw_cancel = asyncio.Event()
    reads_by_handler: list[int] = []
    outcome: dict[str, Any] = {}

    async def renew_leases(original: Any, *args: Any, **kwargs: Any) -> Any:
        reply = await original(*args, **kwargs)
        if any(cancel for _, cancel in reply.values()):
            beat_saw_cancel.set()
        return reply

    async def get(original: Any, task_id: str) -> Any:
        if asyncio.current_task() is handler_task[0]:
            reads_by_handler.append(1)
        return await original(task_id)

    handler_task: list[asyncio.Task[Any] | None] = [None]
    wrap_method(store, "renew_leases", renew_leases)
    wrap_method(store, "get", get)

    @worker.task
    async def long(ctx: TaskContext) -> str:
        handler_task[0] = asyncio.current_task()
        started.set()
        await beat_saw_cancel.wait()
        outcome["canceled"] = await ctx.canceled()
        outcome["reads"] = len(reads_by_handler)
        return "late"

    task = await client.submit("long")
    async with running(worker):
        await asyncio.wait_for(started.wait(), 20)
        await client.cancel(task.id)
        done = await wait_status(store, task.id)
    assert outcome == {"canceled": True, "reads": 0}
    assert done.status == "canceled"


async def test_a_handlers_own_heartbeat_renews_its_lease_and_sees_a_cancel(
    store: TaskStore, client: CairnQ
) -> None:
    """`ctx.heartbeat()` renews the lease (the database's and the worker's own deadline
    alike) for this attempt only, and carries a pending cancel, as the worker's beats do."""
    worker = Worker(store, ["default"], lease_ms=30_000, poll_interval_ms=50)
    started, asked = asyncio.Event(), asyncio.Event()
    seen: dict[str, Any] = {}

    @worker.task
    async def long(ctx: TaskContext) -> str:
        before_db = ctx.task.lease_until_ms
        before_local = ctx.lease_deadline
        started.set()
        await asyncio.wait_for(asked.wait(), 20)
        renewed = await ctx.heartbeat()
        seen["db"] = (before_db or 0) < (renewed.lease_until_ms or 0)
        seen["local"] = ctx.lease_deadline > before_local
        seen["canceled"] = ctx._cancel_seen
        return "done"

    task = await client.submit("long")
    async with running(worker):
        await asyncio.wait_for(started.wait(), 20)
        await client.cancel(task.id)
        asked.set()
        done = await wait_status(store, task.id)
    assert seen == {"db": True, "local": True, "canceled": True}
    assert done.status == "canceled"


# -- max_run_ms ------------------------------------------------------------------------


@pytest.mark.timing
async def test_max_run_ms_abandons_a_hung_async_handler(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    """docs/protocol.md#abandon-hung-attempts: the attempt fails as retryable
    `handler_timeout` and is redelivered at once (not after the 30 s lease); the abandoned
    handler can no longer write."""
    worker = Worker(
        store,
        ["default"],
        max_run_ms=300,
        lease_ms=30_000,
        retry_backoff_ms=10,
        poll_interval_ms=50,
        on_error=errors,
    )
    zombie: dict[str, Any] = {}
    second_attempt = asyncio.Event()
    zombie_done = asyncio.Event()

    @worker.task
    async def hangs(ctx: TaskContext) -> str:
        if ctx.attempt == 1:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                zombie["cancelled"] = True
            # Survive the cancellation and try to write once attempt 2 is running
            # under the same worker id.
            await second_attempt.wait()
            zombie["lost_lease"] = ctx.lost_lease
            for what, write in (
                ("progress", lambda: ctx.progress(0.5, "zombie")),
                ("submit", lambda: ctx.submit("child")),
                ("heartbeat", lambda: ctx.heartbeat()),
            ):
                try:
                    await write()
                    zombie[what] = "written"
                except LostLease:
                    zombie[what] = "LostLease"
            zombie_done.set()
            return "zombie result"
        row = await store.get(ctx.task_id)
        zombie["error_seen_by_retry"] = row.error if row else None
        second_attempt.set()
        await zombie_done.wait()
        return "second"

    t0 = time.monotonic()
    task = await client.submit("hangs", max_attempts=3)
    async with running(worker):
        done = await wait_status(store, task.id)
    assert (done.status, done.result, done.attempt) == ("succeeded", "second", 2)
    assert done.progress == 1.0 and done.message is None
    assert time.monotonic() - t0 < 20, "redelivery must not wait for the lease"
    error = zombie["error_seen_by_retry"]
    assert error["code"] == "handler_timeout"
    assert error["type"] == "HandlerTimeout"
    assert error["retryable"] is True
    assert zombie["cancelled"] is True
    assert zombie["lost_lease"] is True
    assert zombie["progress"] == "LostLease"
    assert zombie["submit"] == "LostLease"
    assert zombie["heartbeat"] == "LostLease"
    assert await client.list(name="child") == []


@SQLITE_ONLY
async def test_max_run_ms_exhausts_attempts(store: TaskStore, client: CairnQ) -> None:
    worker = Worker(store, ["default"], max_run_ms=100, retry_backoff_ms=0, poll_interval_ms=20)

    @worker.task
    async def never(ctx: TaskContext) -> None:
        await asyncio.sleep(60)

    task = await client.submit("never", max_attempts=2)
    async with running(worker):
        done = await wait_status(store, task.id)
    assert (done.status, done.attempt) == ("failed", 2)
    assert done.error["code"] == "handler_timeout"


@SQLITE_ONLY
async def test_max_run_ms_frees_the_slot_of_a_stuck_sync_handler(
    store: TaskStore, client: CairnQ
) -> None:
    """docs/protocol.md §8.6: a sync handler's thread cannot be killed; it keeps running while its
    slot is freed. With concurrency=1 the retry must still run."""
    worker = Worker(
        store, ["default"], concurrency=1, max_run_ms=300, retry_backoff_ms=0, poll_interval_ms=20
    )
    unblock = threading.Event()
    attempts: list[int] = []

    @worker.task
    def stuck_once(ctx: TaskContext) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            unblock.wait(30)
            return "zombie"
        return "second"

    task = await client.submit("stuck_once", max_attempts=3)
    async with running(worker):
        try:
            done = await wait_status(store, task.id, within=10)
        finally:
            unblock.set()
    assert (done.status, done.result, done.attempt) == ("succeeded", "second", 2), (
        done.error,
        attempts,
    )


@SQLITE_ONLY
async def test_max_run_ms_bounds_an_awaitable_returned_by_a_sync_handler(
    store: TaskStore, client: CairnQ
) -> None:
    worker = Worker(store, ["default"], max_run_ms=300, retry_backoff_ms=0, poll_interval_ms=20)
    never = asyncio.Event()

    async def hang() -> str:
        await asyncio.wait_for(never.wait(), 15)
        return "late"

    def starts_async(ctx: TaskContext) -> Any:
        return hang() if ctx.attempt == 1 else "second"

    worker.register("starts_async", starts_async)
    task = await client.submit("starts_async", max_attempts=2)
    async with running(worker):
        try:
            done = await wait_status(store, task.id, within=3)
        finally:
            never.set()
    assert (done.status, done.result, done.attempt) == ("succeeded", "second", 2)


@SQLITE_ONLY
async def test_abandoned_handler_errors_are_retrieved(store: TaskStore, client: CairnQ) -> None:
    """An abandoned attempt that later raises must not surface as asyncio's
    'Task exception was never retrieved' (upstream consumes the outcome)."""
    loop = asyncio.get_running_loop()
    reports: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reports.append(context))
    try:
        worker = Worker(store, ["default"], max_run_ms=200, retry_backoff_ms=0, poll_interval_ms=20)
        zombie_raised = asyncio.Event()

        @worker.task
        async def hangs(ctx: TaskContext) -> str:
            if ctx.attempt == 1:
                try:
                    await asyncio.sleep(60)
                finally:
                    # Cancelled: raise something else from the cleanup.
                    zombie_raised.set()
                    raise RuntimeError("cleanup failed")
            return "second"

        task = await client.submit("hangs", max_attempts=2)
        async with running(worker):
            done = await wait_status(store, task.id)
            await asyncio.wait_for(zombie_raised.wait(), 10)
        for _ in range(3):
            await asyncio.sleep(0)
            gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert done.status == "succeeded"
    unretrieved = [r for r in reports if "never retrieved" in str(r.get("message"))]
    assert not unretrieved, unretrieved


# -- lost lease ------------------------------------------------------------------------


async def expire_and_steal(thief: TaskStore, dialect: str, db_target: str, task_id: str) -> Any:
    """Expire a running task's lease in the database, then claim it from another store."""
    await asyncio.to_thread(
        query,
        dialect,
        db_target,
        "update cairnq_tasks set lease_until_ms = 1 where id = ? and status = 'running'",
        [task_id],
    )
    claimed = await thief.claim(queues=["default"], worker_id="worker_thief", lease_ms=60_000)
    assert [t.id for t in claimed] == [task_id]
    assert claimed[0].attempt == 2
    return claimed[0]


async def test_stolen_lease_is_noticed_and_writes_are_refused(
    store: TaskStore,
    second_store: TaskStore,
    client: CairnQ,
    errors: ErrorLog,
    dialect: str,
    db_target: str,
) -> None:
    worker = Worker(store, ["default"], lease_ms=600, poll_interval_ms=50, on_error=errors)
    started = asyncio.Event()
    stolen = asyncio.Event()
    seen: dict[str, Any] = {}

    @worker.task
    async def victim(ctx: TaskContext) -> str:
        started.set()
        await stolen.wait()
        # The next heartbeat finds the row gone from our ownership.
        await asyncio.wait_for(ctx.lease_lost.wait(), 10)
        seen["lost_lease"] = ctx.lost_lease
        for what, write in (
            ("submit", lambda: ctx.submit("child")),
            ("progress", lambda: ctx.progress(0.9)),
            ("succeed", lambda: ctx.succeed("mine")),
            ("fail", lambda: ctx.fail("mine")),
        ):
            try:
                await write()
                seen[what] = "written"
            except LostLease:
                seen[what] = "LostLease"
        return "zombie result"

    task = await client.submit("victim", max_attempts=3)
    async with running(worker):
        await asyncio.wait_for(started.wait(), 20)
        await expire_and_steal(second_store, dialect, db_target, task.id)
        stolen.set()
        await eventually(lambda: "fail" in seen, what="the victim to finish its writes")
        await eventually(lambda: not worker.in_flight.executing, what="the victim's call to end")
    assert seen == {
        "lost_lease": True,
        "submit": "LostLease",
        "progress": "LostLease",
        "succeed": "LostLease",
        "fail": "LostLease",
    }
    row = await store.get(task.id)
    assert row is not None
    assert (row.status, row.worker_id, row.attempt, row.result) == (
        "running",
        "worker_thief",
        2,
        None,
    )
    assert await client.list(name="child") == []
    assert not errors.calls, "settling a lost task is swallowed, not reported"
    # The thief still owns it and can finish it.
    finished = await second_store.complete(task_id=task.id, worker_id="worker_thief", result="t")
    assert (finished.status, finished.result) == ("succeeded", "t")


@pytest.mark.parametrize("ending", ["return", "raise"])
async def test_settling_a_stolen_task_is_swallowed(
    store: TaskStore,
    second_store: TaskStore,
    client: CairnQ,
    errors: ErrorLog,
    dialect: str,
    db_target: str,
    ending: str,
) -> None:
    """The handler ends before any heartbeat noticed: the settlement write finds the
    row owned by another worker, marks the context lost, and reports nothing."""
    worker = Worker(store, ["default"], lease_ms=30_000, poll_interval_ms=50, on_error=errors)
    started = asyncio.Event()
    stolen = asyncio.Event()
    contexts: list[TaskContext] = []

    @worker.task
    async def victim(ctx: TaskContext) -> str:
        contexts.append(ctx)
        started.set()
        await stolen.wait()
        if ending == "raise":
            raise RuntimeError("zombie failure")
        return "zombie result"

    task = await client.submit("victim", max_attempts=3)
    async with running(worker):
        await asyncio.wait_for(started.wait(), 20)
        await expire_and_steal(second_store, dialect, db_target, task.id)
        stolen.set()
        await eventually(
            lambda: contexts[0].lost_lease or contexts[0].settled,
            what="the victim's settlement attempt",
        )
    assert contexts[0].lost_lease and not contexts[0].settled
    row = await store.get(task.id)
    assert row is not None
    assert (row.status, row.worker_id, row.attempt, row.result, row.error) == (
        "running",
        "worker_thief",
        2,
        None,
        None,
    )
    assert not errors.calls, errors
