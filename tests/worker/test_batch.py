"""docs/protocol.md §8.4-8.6: batch delivery. One call takes a list of contexts; `concurrency`
counts calls, not tasks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.waiting import wait_for_async
from tests.support.worker import (
    POSTGRES_ONLY,
    SQLITE_ONLY,
    ErrorLog,
    running,
    wait_all,
    wait_status,
)

pytestmark = pytest.mark.timeout(60)


async def submit_many(client: CairnQ, name: str, n: int, **kw: Any) -> list[str]:
    tasks = await client.submit_many([{"name": name, "payload": {"i": i}, **kw} for i in range(n)])
    return [t.id for t in tasks]


async def test_batch_handler_gets_contexts_and_maps_results(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50, concurrency=2, on_error=errors)
    calls: list[list[TaskContext]] = []

    @worker.task(batch=4)
    async def double(items: list[TaskContext]) -> dict[str, Any]:
        assert isinstance(items, list)
        assert all(isinstance(c, TaskContext) for c in items)
        calls.append(items)
        return {c.task_id: c.payload["i"] * 2 for c in items}

    ids = await submit_many(client, "double", 10)
    async with running(worker):
        done = await wait_all(store, ids)
    assert [(t.status, t.result) for t in done] == [("succeeded", i * 2) for i in range(10)]
    sizes = sorted(len(c) for c in calls)
    assert sum(sizes) == 10
    assert max(sizes) == 4, sizes
    assert all(1 <= s <= 4 for s in sizes)
    # Each context's own fields are right.
    flat = {c.task_id: c for call in calls for c in call}
    assert set(flat) == set(ids)
    assert all(c.attempt == 1 and c.name == "double" for c in flat.values())
    assert not errors.calls, errors


@pytest.mark.parametrize("returned", [None, "done", ["a", "list"], 42])
@SQLITE_ONLY
async def test_batch_non_mapping_return_gives_none_results(
    store: TaskStore, client: CairnQ, returned: Any
) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50)

    @worker.task(batch=4)
    async def sink(items: list[TaskContext]) -> Any:
        return returned

    ids = await submit_many(client, "sink", 6)
    async with running(worker):
        done = await wait_all(store, ids)
    assert [(t.status, t.result) for t in done] == [("succeeded", None)] * 6


async def test_batch_partial_mapping_and_per_item_settlement(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50, on_error=errors)

    @worker.task(batch=4)
    async def mixed(items: list[TaskContext]) -> dict[str, Any]:
        by_i = {c.payload["i"]: c for c in items}
        await by_i[0].fail("no source records", retryable=False)
        await by_i[1].succeed("settled early")
        # 0 and 1 are settled already: their mapping entries are ignored. 3 is absent.
        return {c.task_id: f"r{c.payload['i']}" for c in items if c.payload["i"] != 3}

    ids = await submit_many(client, "mixed", 4, max_attempts=3)
    async with running(worker):
        done = await wait_all(store, ids)
    assert [(t.status, t.result) for t in done] == [
        ("failed", None),
        ("succeeded", "settled early"),
        ("succeeded", "r2"),
        ("succeeded", None),
    ]
    assert done[0].attempt == 1 and done[0].error["message"] == "no source records"
    assert not errors.calls, errors


async def test_batch_raise_fails_every_unsettled_item(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50, retry_backoff_ms=10, on_error=errors)

    @worker.task(batch=3)
    async def explodes(items: list[TaskContext]) -> None:
        for c in items:
            if c.payload["i"] == 0 and c.attempt == 1:
                await c.succeed("kept")
        raise RuntimeError("whole batch down")

    ids = await submit_many(client, "explodes", 3, max_attempts=2)
    async with running(worker):
        done = await wait_all(store, ids)
    assert (done[0].status, done[0].result) == ("succeeded", "kept")
    for task in done[1:]:
        assert (task.status, task.attempt) == ("failed", 2)
        assert task.error["code"] == "handler_error"
        assert task.error["type"] == "RuntimeError"
    assert not errors.calls, errors


async def test_concurrency_counts_calls_not_tasks(store: TaskStore, client: CairnQ) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50, concurrency=1)
    sizes: list[int] = []

    @worker.task(batch=256)
    async def bulk(items: list[TaskContext]) -> None:
        sizes.append(len(items))

    ids = await submit_many(client, "bulk", 300)
    async with running(worker):
        await wait_all(store, ids)
    assert sizes[0] == 256, sizes
    assert sum(sizes) == 300


@SQLITE_ONLY
async def test_batch_and_single_sources_share_the_call_budget(
    store: TaskStore, client: CairnQ
) -> None:
    """Two batch calls plus singles, never more calls in flight than `concurrency`."""
    worker = Worker(store, ["default"], poll_interval_ms=50, concurrency=3)
    in_flight = 0
    peak = 0
    release = asyncio.Event()

    async def hold() -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await release.wait()
        in_flight -= 1

    @worker.task(batch=5)
    async def batched(items: list[TaskContext]) -> None:
        await hold()

    @worker.task
    async def single(ctx: TaskContext) -> None:
        await hold()

    ids = await submit_many(client, "batched", 20) + await submit_many(client, "single", 5)
    async with running(worker):
        await wait_for_async("three calls in flight", lambda: in_flight, accept=lambda n: n == 3)
        release.set()
        await wait_all(store, ids)
    assert peak == 3


@POSTGRES_ONLY
async def test_a_poison_result_does_not_block_its_batch_mates(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    """Postgres jsonb refuses `\\u0000`, so one result cannot be stored (on either
    dialect: the store refuses it before the database would). Its neighbours' results
    must still land promptly (upstream settles each task on its own)."""
    worker = Worker(store, ["default"], poll_interval_ms=50, on_error=errors)

    @worker.task(batch=2)
    async def pair(items: list[TaskContext]) -> dict[str, Any]:
        return {c.task_id: ("bad\x00value" if c.payload["i"] == 0 else "fine") for c in items}

    @worker.task
    async def plain(ctx: TaskContext) -> str:
        return "plain"

    ids = await submit_many(client, "pair", 2)
    async with running(worker):
        good = await wait_status(store, ids[1], within=3.0)
        assert (good.status, good.result) == ("succeeded", "fine")
        poisoned = await wait_status(store, ids[0], within=3.0)
        # The worker keeps claiming and settling other work meanwhile.
        later = await client.submit("plain")
        done = await wait_status(store, later.id, within=3.0)
        assert (done.status, done.result) == ("succeeded", "plain")
    assert poisoned.status == "failed"
    assert poisoned.error is not None and poisoned.error["code"] == "unserializable_result"
