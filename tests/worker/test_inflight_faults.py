"""The worker's in-flight bookkeeping under faults: leases that lapse while a task waits
in the backlog, a task that comes back to the same worker while its first attempt still
runs, and the order a claimed batch starts in.

The heartbeat is stalled by gating the real store's `renew_leases` (the statement
still runs once the gate opens), which is what a stalled loop or a slow database looks
like from the worker's side.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.worker import SQLITE_ONLY, eventually, running, wait_all, wrap_method

pytestmark = SQLITE_ONLY


def gate_heartbeats(store: TaskStore) -> asyncio.Event:
    """Hold every heartbeat until the returned event is set."""
    open_ = asyncio.Event()

    async def gated(original: Any, *args: Any, **kwargs: Any) -> Any:
        await open_.wait()
        return await original(*args, **kwargs)

    wrap_method(store, "renew_leases", gated)
    return open_


async def test_a_backlog_task_whose_lease_lapsed_is_never_started(
    store: TaskStore, client: CairnQ, caplog: pytest.LogCaptureFixture
) -> None:
    # One slot, two tasks claimed ahead. The first runs past the lease while no
    # heartbeat gets through, so the two waiting behind it may already be someone
    # else's by the time the slot frees: they must not start on this claim.
    starts: list[tuple[str, int]] = []
    release_heartbeats = gate_heartbeats(store)
    worker = Worker(store, concurrency=1, prefetch=2, lease_ms=1000, poll_interval_ms=20)

    @worker.task("job")
    async def job(ctx: Any, payload: Any) -> str:
        starts.append((ctx.task_id, ctx.attempt))
        if payload["slow"] and ctx.attempt == 1:
            await asyncio.sleep(1.5)
            release_heartbeats.set()
        return "done"

    slow = await client.submit("job", {"slow": True}, priority=10)
    fast = [await client.submit("job", {"slow": False}) for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="cairnqd.worker"):
        async with running(worker):
            done = await wait_all(store, [slow.id, *(t.id for t in fast)])
    assert [t.status for t in done] == ["succeeded"] * 3
    for task in fast:
        assert (task.id, 1) not in starts, f"started {task.id} on a lapsed lease: {starts}"
        assert (task.id, 2) in starts
    # The slow attempt's result came back after its lease could have passed: dropped,
    # and said so with the task and attempt.
    lost = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
    assert any(slow.id in m and "attempt 1" in m and "after its handler started" in m for m in lost)
    assert all(any(t.id in m and "before it started" in m for m in lost) for t in fast)


async def test_a_task_back_on_the_same_worker_keeps_both_attempts_apart(
    store: TaskStore, client: CairnQ
) -> None:
    # Attempt 1 hangs on while its lease lapses (heartbeats held); recovery requeues the
    # task and this same worker claims it again as attempt 2. Attempt 2 must keep its
    # lease renewed after attempt 1 finally ends: keyed by task id alone, the end of
    # attempt 1 would drop attempt 2 from the heartbeat and it would run a third time.
    attempts: list[int] = []
    release_heartbeats = gate_heartbeats(store)
    first_may_end = asyncio.Event()
    worker = Worker(store, concurrency=2, prefetch=0, lease_ms=1000, poll_interval_ms=20)

    @worker.task("twice")
    async def twice(ctx: Any) -> int:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            await first_may_end.wait()
            return 1
        release_heartbeats.set()
        first_may_end.set()
        await asyncio.sleep(2.5)  # well past one lease: only heartbeats keep it ours
        return ctx.attempt

    task = await client.submit("twice", max_attempts=5)
    async with running(worker):
        (done,) = await wait_all(store, [task.id], within=30)
    assert done.status == "succeeded", done
    assert done.result == 2
    assert attempts == [1, 2]


async def test_a_claimed_batch_starts_in_claim_order(store: TaskStore, client: CairnQ) -> None:
    # Rows come back from the claim in table order; the worker must start them in the
    # order the claim picked them: priority first, then due time, then id.
    rng = random.Random(7)
    submitted = [await client.submit("p", priority=rng.randint(-5, 5)) for _ in range(40)]
    started: list[str] = []
    worker = Worker(store, concurrency=1, prefetch=64, poll_interval_ms=20)

    @worker.task("p")
    async def p(ctx: Any) -> None:
        started.append(ctx.task_id)

    async with running(worker):
        await eventually(lambda: len(started) == len(submitted), what="every task to start")
    by_id = {t.id: t for t in submitted}
    expected = sorted(submitted, key=lambda t: (-t.priority, t.run_at_ms, t.id))
    assert [by_id[i].priority for i in started] == [t.priority for t in expected]
