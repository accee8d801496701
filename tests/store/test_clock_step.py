"""A step of the host's wall clock must not recover live leases or refuse their renewals.

On SQLite, leases and due times are wall-clock milliseconds. Before, a forward step of
120 s made every running lease look expired to the next recovery, and a long task ran
again beside itself. The store now notices a step (`store/clockstep.py`: the wall clock
against CLOCK_BOOTTIME) and reads the old clock on for a grace, while the leases it
writes end by the new one, so live workers renew on the new clock before it counts. The
step is a time shim: the store's statements and its watch read a clock the test moves
(`ShiftedClock`).

On Postgres the database's clock is the server's, which the scheduler now reads too.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from cairnqd.context import TaskContext
from cairnqd.daemon.parent.metrics import Metrics
from cairnqd.daemon.parent.scheduler import Scheduler
from cairnqd.store.base import TaskStore
from cairnqd.store.clockstep import STEP_S, WallClockWatch
from cairnqd.store.sqlite import SQLiteStore
from cairnqd.worker import Worker
from tests.support.databases import make_store
from tests.support.harness import daemon_config
from tests.support.store import ShiftedClock
from tests.support.worker import POSTGRES_ONLY, running, wait_status


class Ticks:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_watch_rides_out_a_forward_step_and_lets_a_backward_one_through() -> None:
    wall, mono = Ticks(), Ticks()
    watch = WallClockWatch(wall=wall, monotonic=mono, grace_s=30)
    for _ in range(100):  # NTP slewing: 0.5 ms a second at most
        wall.now += 1.0005
        mono.now += 1.0
    assert watch() == int(wall.now * 1000) and watch.lease_lead_ms() == 0
    wall.now += 120  # `date -s` two minutes ahead
    assert watch() == int((wall.now - 120) * 1000), "statements read the old clock on"
    assert watch.lease_lead_ms() == 120_000, "a lease written now ends by the new clock"
    mono.now += 29
    wall.now += 29
    assert watch() == int((wall.now - 120) * 1000)
    mono.now += 2
    wall.now += 2
    assert watch() == int(wall.now * 1000) and watch.lease_lead_ms() == 0, "grace over"
    wall.now -= 3600  # an hour back: nothing to hold off, what is due waits
    assert watch() == int(wall.now * 1000) and watch.lease_lead_ms() == 0
    assert watch.last_step_s == pytest.approx(-3600)
    assert STEP_S <= 1.0


def test_a_longer_lease_lengthens_the_grace() -> None:
    wall, mono = Ticks(), Ticks()
    watch = WallClockWatch(wall=wall, monotonic=mono, grace_s=30)
    watch.at_least(90)
    watch.at_least(10)
    wall.now += 300
    watch()
    mono.now += 60
    wall.now += 60
    assert watch.lease_lead_ms() == 300_000
    mono.now += 31
    wall.now += 31
    watch()
    assert watch.lease_lead_ms() == 0


def _stepping_store(path: Path, clock: ShiftedClock, grace_s: float = 30.0) -> SQLiteStore:
    store = SQLiteStore(str(path), clock=clock)
    store.use_clock_watch(WallClockWatch(wall=lambda: clock() / 1000, grace_s=grace_s))
    return store


async def test_a_forward_step_neither_recovers_nor_refuses_a_live_lease(tmp_path: Path) -> None:
    clock = ShiftedClock()
    async with _stepping_store(tmp_path / "t.db", clock, grace_s=1.0) as store:
        task = await store.submit(name="long", payload={})
        # The grace grows to the lease seen: 2 s.
        await store.claim(queues=["default"], worker_id="w", lease_ms=2000)
        clock.offset_ms += 120_000  # the administrator's `date -s`
        assert await store.recover_leases() == []
        # The live worker's renewals go through, and its lease ends by the new clock.
        for _ in range(2):
            reply = await store.renew_leases(held=[(task.id, 1)], worker_id="w", lease_ms=2000)
            assert task.id in reply
            renewed = await store.get(task.id)
            assert renewed is not None and renewed.lease_until_ms is not None
            assert renewed.lease_until_ms > clock() + 1000
            await asyncio.sleep(1.1)
        # The grace is over, statements read the new clock: the renewed lease holds.
        watch = store.clock_watch
        assert watch is not None and abs(watch() - clock()) < 50
        assert await store.recover_leases() == []
        found = await store.get(task.id)
        assert found is not None and found.status == "running" and found.attempt == 1


async def test_without_the_watch_a_forward_step_recovers_a_live_lease(tmp_path: Path) -> None:
    """What the watch prevents: the same step, read by a store that does not ride it out."""
    clock = ShiftedClock()
    async with SQLiteStore(str(tmp_path / "t.db"), clock=clock) as store:
        task = await store.submit(name="long", payload={})
        await store.claim(queues=["default"], worker_id="w", lease_ms=30_000)
        clock.offset_ms += 120_000
        assert await store.renew_leases(held=[(task.id, 1)], worker_id="w", lease_ms=30_000) == {}
        recovered = await store.recover_leases()
        assert [r["id"] for r in recovered] == [task.id]


async def test_a_worker_across_a_forward_step_runs_its_task_once(tmp_path: Path) -> None:
    clock = ShiftedClock()
    starts: list[int] = []
    step_now = asyncio.Event()
    async with _stepping_store(tmp_path / "t.db", clock) as store:
        worker = Worker(store, concurrency=2, lease_ms=2000, poll_interval_ms=50, prefetch=0)

        @worker.task("long")
        async def long(ctx: TaskContext, payload: Any) -> str:
            starts.append(ctx.attempt)
            step_now.set()
            await asyncio.sleep(6)
            return "done"

        task = await store.submit(name="long", payload={})
        async with running(worker, stop_timeout=30):
            await asyncio.wait_for(step_now.wait(), 20)
            clock.offset_ms += 120_000
            done = await wait_status(store, task.id, within=30)
        assert done.status == "succeeded" and done.attempt == 1, done
        assert starts == [1], f"ran again across the step: {starts}"


async def test_a_backward_step_delays_what_is_due_by_the_step(tmp_path: Path) -> None:
    """Documented, not prevented: due times are wall-clock moments, so a clock set back
    an hour keeps a task that was due waiting an hour longer."""
    clock = ShiftedClock()
    async with _stepping_store(tmp_path / "t.db", clock) as store:
        task = await store.submit(name="later", payload={})  # due now
        clock.offset_ms -= 3_600_000
        assert await store.claim(queues=["default"], worker_id="w") == []
    # By the clock it was submitted on, it is due.
    async with SQLiteStore(str(tmp_path / "t.db")) as unshifted:
        claimed = await unshifted.claim(queues=["default"], worker_id="w")
        assert [t.id for t in claimed] == [task.id]


@POSTGRES_ONLY
async def test_the_scheduler_reads_the_database_clock(
    store: TaskStore, db_target: str, tmp_path: Path, dialect: str
) -> None:
    config = daemon_config(
        tmp_path, dialect, db_target, schedules={"tick": {"name": "demo.echo", "every": "1s"}}
    )
    metrics = Metrics(config)
    read: list[int] = []
    scheduler = Scheduler(
        config, metrics, store_factory=lambda: _observed(make_store(dialect, db_target), read)
    )
    try:
        await scheduler.run_once()
        server_ms = await store.database_now_ms()
        assert read, "the scheduler did not read the database's clock"
        assert abs(read[0] - server_ms) < 5_000
        await scheduler.run_once()
        assert len(read) == 2, "each pass reads the database's clock"
    finally:
        await scheduler.aclose()
        metrics.close()


def _observed(store: TaskStore, read: list[int]) -> TaskStore:
    """Record each reading of the database clock (the real one still answers)."""
    original = store.database_now_ms

    async def database_now_ms() -> int:
        value = await original()
        read.append(value)
        return value

    store.database_now_ms = database_now_ms  # type: ignore[method-assign]
    return store
