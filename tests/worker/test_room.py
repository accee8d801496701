"""`Worker.on_room`: told when a task claimed now would start at once (a free call slot,
nothing claimed ahead waiting for one) and when not, only on a flip; `empty_claims`
counts the claims that asked for tasks and found none. A daemon child reports the first
to its parent, which routes relayed wake-ups by it (daemon/parent/wakerouting.py)."""

from __future__ import annotations

import asyncio

import pytest

from cairnqd.context import TaskContext
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.worker import eventually, running, wait_status

pytestmark = pytest.mark.timeout(60)


async def test_room_flips_as_the_slots_fill_and_free(store: TaskStore) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50, prefetch=0)
    gates: dict[str, asyncio.Event] = {}
    flips: list[bool] = []
    worker.on_room = flips.append

    @worker.task
    async def hold(ctx: TaskContext) -> None:
        await gates.setdefault(ctx.task_id, asyncio.Event()).wait()

    async with running(worker, concurrency=2):
        await eventually(lambda: flips == [True], what="the first report: room")
        first = await store.submit(name="hold")
        await wait_status(store, first.id, "running")
        assert flips == [True]  # one of two slots taken: still room
        second = await store.submit(name="hold")
        await wait_status(store, second.id, "running")
        await eventually(lambda: flips == [True, False], what="no room with both slots taken")
        gates.setdefault(first.id, asyncio.Event()).set()
        await wait_status(store, first.id, "succeeded")
        await eventually(lambda: flips == [True, False, True], what="room again")
        gates.setdefault(second.id, asyncio.Event()).set()
        await wait_status(store, second.id, "succeeded")
    assert flips == [True, False, True]


async def test_claims_that_find_nothing_are_counted(store: TaskStore) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=20)

    @worker.task
    async def noop(ctx: TaskContext) -> None:
        return None

    async with running(worker, concurrency=1):
        await eventually(lambda: worker.empty_claims >= 3, what="idle polls to find nothing")
        task = await store.submit(name="noop")
        await wait_status(store, task.id, "succeeded")
