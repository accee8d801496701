"""The parent loop's cadence: when it plans its next tick, from which reasons, and what
counts as a stall; without real processes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cairnqd.config import Config, load_config
from cairnqd.daemon.parent.cadence import BUSY_TICK_S, IDLE_TICK_S, Cadence, Due
from cairnqd.daemon.parent.deadlines import QUIT_GRACE_S, next_due, reported_trouble
from cairnqd.daemon.parent.pool import ChildProcess, GroupPool
from cairnqd.daemon.wire.messages import Overrun

CONFIG = """\
version: 1
database: {path: ./t.db}
handlers: [cairnqd.demo:registry]
supervisor: {heartbeat_timeout: 30s, backoff_max: 10s, fatal_cooldown: 60s}
groups:
  mail: {queues: [mail], processes: 2, lease: 30s, max_run: 20s}
"""


def load(tmp_path: Path) -> Config:
    path = tmp_path / "cairnq.yaml"
    path.write_text(CONFIG)
    return load_config(path)


def child(slot: int, state: str = "ready", last_heard: float = 100.0) -> ChildProcess:
    # No process or pipes: only the pid is read.
    fake: Any = SimpleNamespace(pid=1000 + slot)
    return ChildProcess(
        group="mail", slot=slot, generation=1, worker_id=f"w{slot}", proc=fake,
        events=fake, control=fake, spawned_at=90.0, state=state, last_heard=last_heard,
    )  # fmt: skip


def full_pool(config: Config) -> GroupPool:
    pool = GroupPool(config.groups["mail"], "f", config)
    for slot in pool.slots:
        slot.child = child(slot.index)
    return pool


def test_the_earliest_reason_wins_between_the_busy_and_the_idle_tick() -> None:
    cadence = Cadence(0.0)
    assert cadence.plan(10.0, []) == Due(10.0 + IDLE_TICK_S, "idle")
    assert cadence.plan(10.0, [Due(60.0, "far")]) == Due(10.0 + IDLE_TICK_S, "idle")
    assert cadence.plan(10.0, [Due(10.6, "a"), Due(10.4, "b")]) == Due(10.4, "b")
    # Due now, or overdue: no sooner than the busy tick.
    busy = Due(10.0 + BUSY_TICK_S, "roll")
    assert cadence.plan(10.0, [Due(10.0, "roll"), Due(10.4, "b")]) == busy
    assert cadence.plan(10.0, [Due(3.0, "late")]) == Due(10.0 + BUSY_TICK_S, "late")
    assert cadence.ticks == 5


def test_lateness_is_measured_from_the_planned_tick_not_the_last_one() -> None:
    cadence = Cadence(0.0)
    cadence.plan(10.0, [])  # planned for 11.0
    assert cadence.wait_s(10.25) == 0.75 and cadence.wait_s(12.0) == 0.0
    assert not cadence.due(10.9) and cadence.due(11.0)
    assert cadence.late_s(10.5) == 0.0, "an event brought the tick forward"
    assert cadence.late_s(13.5) == pytest.approx(2.5), "it slept 3.5 s, not 1 s"


def test_a_steady_pool_is_due_only_at_its_heartbeat_deadlines(tmp_path: Path) -> None:
    config = load(tmp_path)
    pool = full_pool(config)
    assert pool.next_spawn(100.0) is None
    due = list(next_due([pool], config.supervisor, 100.0))
    assert sorted(d.at for d in due) == [130.0, 130.0]
    assert {d.why for d in due} == {"heartbeat_timeout of child 1000",
                                    "heartbeat_timeout of child 1001"}  # fmt: skip


def test_booting_children_and_reported_trouble_are_due_now(tmp_path: Path) -> None:
    config = load(tmp_path)
    pool = full_pool(config)
    group = config.groups["mail"]
    booting, stalled = pool.slots[0].child, pool.slots[1].child
    assert booting is not None and stalled is not None
    booting.state = "db_wait"
    stalled.lag_s = 11.0  # past the stall bound, a third of the 30 s lease
    assert reported_trouble(stalled, group) and not reported_trouble(booting, group)
    now = 100.0
    due = {d.why: d.at for d in next_due([pool], config.supervisor, now)}
    assert due["child 1000 db_wait"] == now
    assert due["child 1001 reported trouble"] == now
    stalled.lag_s = 0.0
    stalled.overdue = (Overrun("t1", 1, 21.0),)  # inside max_run's grace: not yet
    assert not reported_trouble(stalled, group)
    stalled.overdue = (Overrun("t1", 1, 23.0),)
    assert reported_trouble(stalled, group)


def test_a_child_told_to_stop_is_due_at_its_grace_or_drain_deadline(tmp_path: Path) -> None:
    config = load(tmp_path)
    pool = full_pool(config)
    draining, quitting = pool.slots[0].child, pool.slots[1].child
    assert draining is not None and quitting is not None
    draining.drain_deadline = 104.0
    quitting.quit_sent_at = 101.0
    quitting.lag_s = 99.0  # already being stopped: no trouble to act on
    due = sorted((d.at, d.why) for d in next_due([pool], config.supervisor, 100.0))
    assert due == [
        (101.0 + QUIT_GRACE_S, "SIGKILL of child 1001 after SIGQUIT"),
        (104.0, "drain deadline of child 1000"),
        (130.0, "heartbeat_timeout of child 1000"),
    ]


def test_an_empty_slot_is_due_when_its_pool_may_spawn(tmp_path: Path) -> None:
    config = load(tmp_path)
    pool = full_pool(config)
    pool.slots[1].child = None
    pool.slots[1].restart_at = 104.5
    assert pool.next_spawn(100.0) == Due(104.5, "restart of mail/1")
    pool.state = "crashloop"
    assert pool.next_spawn(100.0) == Due(100.0, "group mail crash-looping")
    pool.state = "running"
    pool.mark_fatal("ImportError: boom", 100.0)
    assert pool.next_spawn(100.0) == Due(160.0, "group mail cool-down")
