"""The scheduler's passes on a real database with an injected clock: each slot once
across two schedulers and a restart, misfire policies over a simulated downtime, a
changed rule starting from its next slot, leadership on Postgres, and the metrics."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cairnqd.config import Config
from cairnqd.daemon.parent.metrics import Metrics
from cairnqd.daemon.parent.scheduler import Scheduler, slot_request
from cairnqd.store.base import TaskStore
from cairnqd.store.tables.schedules import ScheduleTable, slot_key
from tests.support.databases import make_store
from tests.support.harness import daemon_config

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z, on a whole minute


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def schedules_config(tmp_path: Path, dialect: str, target: str, **schedules: Any) -> Config:
    return daemon_config(tmp_path, dialect, target, schedules=schedules)


NEXT_FIRE = "cairnq_schedule_next_fire_timestamp_seconds"
TICK = {"name": "demo.echo", "every": "1s", "payload": {"n": 1}, "misfire": {"catch_up": 3}}


@pytest.fixture
async def store(dialect: str, db_target: str) -> AsyncIterator[TaskStore]:
    async with make_store(dialect, db_target) as s:
        yield s


_OPENED: list[Metrics] = []


@pytest.fixture(autouse=True)
def close_metrics() -> Iterator[None]:
    """A scrape (`sample`) starts each Metrics' database collector: close them all."""
    yield
    while _OPENED:
        _OPENED.pop().close()


def scheduler_for(
    config: Config, dialect: str, target: str, clock: Clock, host: str
) -> tuple[Scheduler, Metrics]:
    metrics = Metrics(config)
    _OPENED.append(metrics)
    factory: Callable[[], TaskStore] = lambda: make_store(dialect, target)  # noqa: E731
    return Scheduler(config, metrics, store_factory=factory, wall_clock=clock, host=host), metrics


async def slots_enqueued(store: TaskStore, name: str = "demo.echo") -> Counter[str]:
    tasks = await store.list(name=name, limit=10_000)
    return Counter(str(t.metadata["slot"]) for t in tasks if "slot" in t.metadata)


async def test_two_schedulers_and_a_restart_enqueue_each_slot_once(
    dialect: str, db_target: str, tmp_path: Path, store: TaskStore
) -> None:
    config = schedules_config(tmp_path, dialect, db_target, tick=TICK)
    clock = Clock()
    a, _ = scheduler_for(config, dialect, db_target, clock, "host-a")
    b, _ = scheduler_for(config, dialect, db_target, clock, "host-b")
    try:
        await a.run_once()  # first sight: the schedule starts after T0
        for step in range(1, 11):
            clock.t = T0 + step + 0.2
            # Both look at every slot; on SQLite both lead, on Postgres only one does.
            await a.run_once()
            await b.run_once()
        await a.aclose()  # a restart: a fresh scheduler, same clock
        a, _ = scheduler_for(config, dialect, db_target, clock, "host-a2")
        await a.run_once()
        await b.run_once()
    finally:
        await a.aclose()
        await b.aclose()
    enqueued = await slots_enqueued(store)
    assert len(enqueued) == 10 and set(enqueued.values()) == {1}, enqueued
    # Each slot's task carries the slot's key.
    task = await store.get_by_key(slot_key("tick", int((T0 + 10) * 1000)))
    assert task is not None and task.payload == {"n": 1}


async def test_a_finished_slot_is_not_enqueued_again(
    dialect: str, db_target: str, tmp_path: Path, store: TaskStore
) -> None:
    # The key alone would not hold: `reuse` hands out a finished task's key again.
    config = schedules_config(tmp_path, dialect, db_target, tick=TICK)
    clock = Clock()
    a, _ = scheduler_for(config, dialect, db_target, clock, "host-a")
    try:
        await a.run_once()
        clock.t = T0 + 1.1
        await a.run_once()
        assert len(await store.list(name="demo.echo")) == 1
        claimed = await store.claim(worker_id="w", queues=["default"], limit=1)
        await store.complete(task_id=claimed[0].id, worker_id="w", result=None)
        table = ScheduleTable(store)
        request = slot_request(config.schedules["tick"], _at(T0 + 1), int(clock.t * 1000))
        again = await table.fire("tick", int((T0 + 1) * 1000), request, host="x", at_ms=0)
        assert again is None
    finally:
        await a.aclose()
    assert len(await store.list(name="demo.echo")) == 1


def _at(t: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC)


@pytest.mark.parametrize(
    ("misfire", "fired", "skipped"),
    [("skip", 1, 59), ("once", 2, 58), ({"catch_up": 5}, 6, 54), ({"catch_up": 100}, 60, 0)],
)
async def test_misfire_policy_across_a_simulated_downtime(
    dialect: str,
    db_target: str,
    tmp_path: Path,
    store: TaskStore,
    misfire: Any,
    fired: int,
    skipped: int,
) -> None:
    rule = {**TICK, "misfire": misfire, "every": "1m"}
    config = schedules_config(tmp_path, dialect, db_target, tick=rule)
    clock = Clock()
    first, _ = scheduler_for(config, dialect, db_target, clock, "before")
    await first.run_once()
    await first.aclose()
    clock.t = T0 + 3600 + 2  # an hour down; back 2 s after the 60th slot
    back, metrics = scheduler_for(config, dialect, db_target, clock, "after")
    try:
        await back.run_once()
    finally:
        await back.aclose()
    enqueued = await slots_enqueued(store)
    assert len(enqueued) == fired and set(enqueued.values()) == {1}
    newest = sorted(enqueued)[-1]
    assert newest == "2027-01-15T09:00:00.000Z"  # the on-time slot always fires
    rows = await ScheduleTable(store).rows()
    assert rows["tick"].misfires == skipped
    assert sample(metrics, "cairnq_schedule_misfires_total", schedule="tick") == skipped
    assert sample(metrics, "cairnq_schedule_fired_total", schedule="tick") == fired


async def test_a_pass_that_ends_past_a_slot_looks_at_that_slot_next(
    dialect: str, db_target: str, tmp_path: Path, store: TaskStore
) -> None:
    """A pass that reads the clock just before a slot and ends after it (a slow pass:
    the first one creates the schedule's row; a loaded machine) leaves that slot to
    the next pass, which must come at once, not at the slot after: an `every 1s` slot
    looked at a second late is past its grace, and `skip` gave it up."""
    rule = {**TICK, "misfire": "skip"}
    clock = Clock()
    a, _ = scheduler_for(
        schedules_config(tmp_path, dialect, db_target, tick=rule), dialect, db_target, clock, "a"
    )
    try:
        await a.run_once()  # first sight: starts after T0
        # 0.1 ms before the slot: the pass's own statements take longer than that.
        clock.t = T0 + 1 - 0.0001
        delay = await a.run_once()
        assert await slots_enqueued(store) == Counter()  # not due when the pass looked
        assert delay <= 0.05  # the slot went by meanwhile: look again at once
        clock.t += delay
        await a.run_once()
    finally:
        await a.aclose()
    assert list(await slots_enqueued(store)) == ["2027-01-15T08:00:01.000Z"]
    assert (await ScheduleTable(store).rows())["tick"].misfires == 0


async def test_a_changed_rule_starts_from_its_next_slot(
    dialect: str, db_target: str, tmp_path: Path, store: TaskStore
) -> None:
    hourly = {**TICK, "every": "1h", "misfire": {"catch_up": 100}}
    clock = Clock()
    a, _ = scheduler_for(
        schedules_config(tmp_path, dialect, db_target, tick=hourly), dialect, db_target, clock, "a"
    )
    await a.run_once()
    clock.t = T0 + 1800.5
    # Reloaded to every minute half an hour in: the 30 minutes behind are not caught up.
    a.reconfigure(schedules_config(tmp_path, dialect, db_target, tick={**hourly, "every": "1m"}))
    try:
        await a.run_once()
        assert await slots_enqueued(store) == Counter()
        clock.t = T0 + 1860.5
        await a.run_once()
    finally:
        await a.aclose()
    assert list(await slots_enqueued(store)) == ["2027-01-15T08:31:00.000Z"]


async def test_disabled_schedule_never_fires_and_re_enabling_starts_afresh(
    dialect: str, db_target: str, tmp_path: Path, store: TaskStore
) -> None:
    clock = Clock()
    off = schedules_config(tmp_path, dialect, db_target, tick={**TICK, "enabled": False})
    a, metrics = scheduler_for(off, dialect, db_target, clock, "a")
    try:
        await a.run_once()
        clock.t = T0 + 30.5
        await a.run_once()
        assert await slots_enqueued(store) == Counter()
        assert (
            sample(metrics, "cairnq_schedule_next_fire_timestamp_seconds", schedule="tick") is None
        )
        a.reconfigure(schedules_config(tmp_path, dialect, db_target, tick=TICK))
        await a.run_once()  # catch_up 3 would find 30 missed slots, but enabling is a fresh start
        clock.t = T0 + 31.5
        await a.run_once()
    finally:
        await a.aclose()
    assert list(await slots_enqueued(store)) == ["2027-01-15T08:00:31.000Z"]


async def test_metrics_show_last_and_next_fire_and_period(
    dialect: str, db_target: str, tmp_path: Path
) -> None:
    config = schedules_config(tmp_path, dialect, db_target, tick={**TICK, "every": "10s"})
    clock = Clock()
    a, metrics = scheduler_for(config, dialect, db_target, clock, "a")
    try:
        await a.run_once()
        assert sample(metrics, "cairnq_schedule_last_fire_timestamp_seconds", schedule="tick") == T0
        clock.t = T0 + 10.3
        await a.run_once()
        assert sample(metrics, "cairnq_scheduler_leader") == 1
    finally:
        await a.aclose()
    assert sample(metrics, "cairnq_scheduler_leader") == 0  # it handed the lead over
    last = sample(metrics, "cairnq_schedule_last_fire_timestamp_seconds", schedule="tick")
    assert last == pytest.approx(T0 + 10.3, abs=0.01)
    assert (
        sample(metrics, "cairnq_schedule_next_fire_timestamp_seconds", schedule="tick") == T0 + 20
    )
    assert sample(metrics, "cairnq_schedule_period_seconds", schedule="tick") == 10
    # A reload without the schedule drops its series.
    metrics.apply_config(daemon_config(tmp_path, dialect, db_target))
    assert sample(metrics, "cairnq_schedule_fired_total", schedule="tick") is None


async def test_only_one_host_leads_on_postgres(pg_dsn: str, tmp_path: Path) -> None:
    config = schedules_config(tmp_path, "postgres", pg_dsn, tick=TICK)
    clock = Clock()
    a, _ = scheduler_for(config, "postgres", pg_dsn, clock, "a")
    b, metrics_b = scheduler_for(config, "postgres", pg_dsn, clock, "b")
    try:
        await a.run_once()
        await b.run_once()
        assert (a.leading, b.leading) == (True, False)
        assert sample(metrics_b, "cairnq_scheduler_leader") == 0
        await a.aclose()  # the leader goes away: the next look of b takes over
        await b.run_once()
        assert b.leading
    finally:
        await a.aclose()
        await b.aclose()


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_slot_request_is_keyed_tagged_and_jittered_alike_on_every_host(tmp_path: Path) -> None:
    rule = {**TICK, "every": "1m", "jitter": "20s", "priority": 5, "max_attempts": 2}
    config = schedules_config(tmp_path, "sqlite", str(tmp_path / "q.db"), tick=rule)
    schedule = config.schedules["tick"]
    slot = _at(T0 + 60)
    slot_ms = int((T0 + 60) * 1000)
    request = slot_request(schedule, slot, now_ms=slot_ms)
    assert request.key == slot_key("tick", slot_ms) and request.conflict == "reuse"
    assert request.metadata == {"schedule": "tick", "slot": "2027-01-15T08:01:00.000Z"}
    assert (request.name, request.queue, request.priority, request.max_attempts) == (
        "demo.echo",
        "default",
        5,
        2,
    )
    assert 0 <= request.delay_ms < 20_000
    # Another host, a second later: the same run_at.
    later = slot_request(schedule, slot, now_ms=slot_ms + 1000)
    assert later.delay_ms == max(0, request.delay_ms - 1000)
    offsets = {
        slot_request(schedule, _at(T0 + 60 * k), now_ms=int((T0 + 60 * k) * 1000)).delay_ms
        for k in range(1, 30)
    }
    assert len(offsets) > 10 and max(offsets) < 20_000  # spread, and within the jitter
    no_jitter = schedules_config(tmp_path, "sqlite", str(tmp_path / "q.db"), tick=TICK)
    assert slot_request(no_jitter.schedules["tick"], slot, now_ms=slot_ms).delay_ms == 0
