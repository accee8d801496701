"""docs/protocol.md §8.5, #claim-by-name, #resource-ceiling-at-claim, #resource-wake:
the claim filters by registered name, and shared resources cap calls across names (and
a release wakes the idle loop)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.waiting import wait_for_async
from tests.support.worker import (
    SQLITE_ONLY,
    running,
    wait_all,
    wait_status,
    wrap_method,
)

pytestmark = pytest.mark.timeout(60)


async def test_workers_only_claim_names_they_handle(
    store: TaskStore, second_store: TaskStore, client: CairnQ
) -> None:
    alpha_worker = Worker(store, ["default"], poll_interval_ms=20, concurrency=3)
    beta_worker = Worker(second_store, ["default"], poll_interval_ms=20, concurrency=3)

    @alpha_worker.task
    async def alpha(ctx: TaskContext) -> str:
        await asyncio.sleep(0.001)
        return "alpha"

    @beta_worker.task
    async def beta(ctx: TaskContext) -> str:
        await asyncio.sleep(0.001)
        return "beta"

    rows = await client.submit_many(
        [{"name": "alpha" if i % 2 else "beta", "max_attempts": 1} for i in range(40)]
    )
    async with running(alpha_worker), running(beta_worker):
        done = await wait_all(store, [t.id for t in rows])
    owners = {"alpha": alpha_worker.worker_id, "beta": beta_worker.worker_id}
    for task in done:
        assert task.status == "succeeded", task.error
        assert task.result == task.name
        assert task.worker_id == owners[task.name]
        assert task.attempt == 1


async def test_resource_caps_calls_across_names(store: TaskStore, client: CairnQ) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=20, concurrency=4, resources={"gpu": 1})
    gpu_now = 0
    gpu_peak = 0
    overall_now = 0
    overall_peak = 0

    async def work(uses_gpu: bool) -> None:
        nonlocal gpu_now, gpu_peak, overall_now, overall_peak
        overall_now += 1
        overall_peak = max(overall_peak, overall_now)
        if uses_gpu:
            gpu_now += 1
            gpu_peak = max(gpu_peak, gpu_now)
        await asyncio.sleep(0.02)
        if uses_gpu:
            gpu_now -= 1
        overall_now -= 1

    @worker.task(resource="gpu")
    async def embed(ctx: TaskContext) -> None:
        await work(True)

    @worker.task(resource="gpu", batch=2)
    async def render(items: list[TaskContext]) -> None:
        await work(True)

    @worker.task
    async def cpu(ctx: TaskContext) -> None:
        await work(False)

    rows = await client.submit_many(
        [{"name": n} for _ in range(6) for n in ("embed", "render", "cpu")]
    )
    async with running(worker):
        done = await wait_all(store, [t.id for t in rows])
    assert all(t.status == "succeeded" for t in done)
    assert gpu_peak == 1, "two calls held the gpu at once"
    assert overall_peak > 1, "the resource must not cap names that do not use it"


@pytest.mark.timing
async def test_resource_release_wakes_the_idle_loop(store: TaskStore, client: CairnQ) -> None:
    """docs/protocol.md#resource-wake: the second gpu task waits only for the first to
    finish, not for the 5 s poll."""
    worker = Worker(store, ["default"], poll_interval_ms=5000, concurrency=2, resources={"gpu": 1})
    release = asyncio.Event()
    started: dict[int, float] = {}
    finished: dict[int, float] = {}

    @worker.task(resource="gpu")
    async def infer(ctx: TaskContext, payload: Any) -> None:
        started[payload["i"]] = time.monotonic()
        if payload["i"] == 0:
            await release.wait()
        finished[payload["i"]] = time.monotonic()

    first = await client.submit("infer", {"i": 0}, priority=10)
    second = await client.submit("infer", {"i": 1})
    async with running(worker):
        await wait_for_async("the first gpu call to start", lambda: 0 in started)
        # The second is due but the gpu is busy: the loop is idle on its 5 s poll.
        assert (await store.get(second.id)).status == "queued"  # type: ignore[union-attr]
        release.set()
        await wait_all(store, [first.id, second.id], within=10)
    latency = started[1] - finished[0]
    assert latency < 1.0, f"the release took {latency:.3f}s to start the next gpu call"


@pytest.mark.timing
@SQLITE_ONLY
async def test_release_during_a_claim_still_wakes_the_idle_loop(
    store: TaskStore, client: CairnQ
) -> None:
    """docs/protocol.md#resource-wake, the narrow case: the release lands while a claim that
    found the gpu full is still in flight. The idle sleep after that claim must not miss
    it."""
    worker = Worker(store, ["default"], poll_interval_ms=2000, concurrency=2, resources={"gpu": 1})
    release = asyncio.Event()
    started: dict[int, float] = {}
    finished: dict[int, float] = {}
    arm = asyncio.Event()

    @worker.task(resource="gpu")
    async def infer(ctx: TaskContext, payload: Any) -> None:
        started[payload["i"]] = time.monotonic()
        if payload["i"] == 0:
            await release.wait()
        finished[payload["i"]] = time.monotonic()

    async def claim_session(original: Any, *args: Any, **kwargs: Any) -> Any:
        result = await original(*args, **kwargs)
        if arm.is_set() and not result:
            arm.clear()
            # The claim found no headroom; the gpu call ends before it returns.
            release.set()
            await wait_for_async("the first call to end", lambda: 0 in finished)
            await asyncio.sleep(0.2)  # let the settlement write land, too
        return result

    wrap_method(store, "claim_session", claim_session)
    first = await client.submit("infer", {"i": 0}, priority=10)
    second = await client.submit("infer", {"i": 1})
    async with running(worker):
        await wait_for_async("the first gpu call to start", lambda: 0 in started)
        arm.set()
        await wait_all(store, [first.id, second.id], within=10)
    latency = started[1] - finished[0]
    assert latency < 1.0, f"the release took {latency:.3f}s to start the next gpu call"


async def test_unregistered_names_and_other_queues_stay_queued(
    store: TaskStore, client: CairnQ
) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=20)

    @worker.task
    async def mine(ctx: TaskContext) -> str:
        return "mine"

    other_name = await client.submit("not_mine")
    other_queue = await client.submit("mine", queue="elsewhere")
    own = await client.submit("mine")
    async with running(worker):
        await wait_status(store, own.id, "succeeded")
        # A few more polls, then the foreign tasks must still be untouched.
        await wait_status(store, (await client.submit("mine")).id, "succeeded")
    for task_id in (other_name.id, other_queue.id):
        row = await store.get(task_id)
        assert row is not None and (row.status, row.attempt) == ("queued", 0)
