"""`Worker.on_room`: told when a task claimed now would start at once (a free call slot,
nothing claimed ahead waiting for one) and when not, only on a flip; `empty_wakes`
counts the wake-ups (a notification, or the poll) whose claim found nothing. A daemon
child reports the first to its parent, which routes relayed wake-ups by it
(daemon/parent/wakerouting.py)."""

from __future__ import annotations

import asyncio

import pytest

from cairnqd.context import TaskContext
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.worker import (
    POSTGRES_ONLY,
    IdleProbe,
    eventually,
    pg_listening,
    running,
    wait_status,
)

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


async def test_wakes_whose_claim_finds_nothing_are_counted(store: TaskStore) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=20)

    @worker.task
    async def noop(ctx: TaskContext) -> None:
        return None

    async with running(worker, concurrency=1):
        await eventually(lambda: worker.empty_wakes >= 3, what="idle polls to find nothing")


# On SQLite a wake-up is any commit to the file (a result written, too), so a wake that
# finds nothing is no sign of a notification answered twice.
@POSTGRES_ONLY
async def test_a_wake_that_finds_its_task_is_not_counted(
    store: TaskStore, second_store: TaskStore, dialect: str, db_target: str
) -> None:
    # The claims a worker makes after taking a task, or to carry a result, find nothing
    # too: they are no wake-up.
    worker = Worker(store, ["default"], poll_interval_ms=30_000)

    @worker.task
    async def noop(ctx: TaskContext) -> None:
        return None

    probe = IdleProbe(store)
    async with running(worker, concurrency=2):
        if dialect == "postgres":
            await eventually(
                lambda: asyncio.to_thread(pg_listening, db_target), what="the worker's LISTEN"
            )
        before = 0
        for n in range(6):
            await eventually(lambda: probe.idle.is_set(), what="the worker to go idle")
            task = await second_store.submit(name="noop")
            await wait_status(store, task.id, "succeeded")
            if n == 0:
                # A LISTEN that (re)connects wakes its waiters to look once (what it
                # may have missed): that look is no answered notification.
                before = worker.empty_wakes
        assert worker.empty_wakes == before
