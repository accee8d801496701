"""Relayed wake-ups on Postgres (`database.direct_dsn`: the parent holds the host's one
LISTEN) go to one child with room per notification, in turn (daemon/parent/
wakerouting.py): both children of a group get work, few claims come up empty, and a
task never waits for a child whose slots are all taken while another has one free."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.support.daemon import Daemon, base_config
from tests.support.harness import client_call
from tests.support.waiting import wait_for

#: Long enough that a task no wake-up reached waits for all to see: every pickup
#: asserted here comes from a wake-up.
POLL = "10s"
TASKS = 16


def config_for(tmp: Path, dsn: str, *, relayed: bool, concurrency: int) -> dict[str, Any]:
    database: dict[str, Any] = {"dsn": dsn, "auto_migrate": True}
    if relayed:
        database["direct_dsn"] = dsn  # the parent LISTENs and passes wake-ups on
    group = {"queues": ["q"], "processes": 2, "concurrency": concurrency, "prefetch": 0}
    config = base_config(tmp, database, {"g": {**group, "poll_interval": POLL}})
    config["supervisor"]["heartbeat_interval"] = "100ms"
    return config


@contextmanager
def serving(tmp: Path, config: dict[str, Any]) -> Iterator[Daemon]:
    tmp.mkdir()
    daemon = Daemon(tmp, config).start()
    try:
        wait_for("both children ready", lambda: len(children(daemon)) == 2, timeout=60)
        yield daemon
    finally:
        assert daemon.stop() == 0


def children(daemon: Daemon) -> list[dict[str, Any]]:
    """The group's ready children, as `cairnqd status --json` shows them."""
    (group,) = [g for g in daemon.snapshot()["groups"] if g["name"] == "g"]
    return [c for c in group["children"] if c["state"] == "ready"]


def run_one(dsn: str, name: str, payload: dict[str, Any]) -> Any:
    async def go(client: CairnQ) -> Any:
        return await client.submit(name, payload, queue="q")

    return client_call("postgres", dsn, go)


def get(dsn: str, task_id: str) -> Any:
    return client_call("postgres", dsn, lambda c: c.get(task_id))


def one_at_a_time(dsn: str, n: int) -> list[str]:
    """Submit `n` tasks, each once the one before has succeeded; their worker ids."""
    ran = []
    for i in range(n):
        task = run_one(dsn, "t.echo", {"i": i})
        done = client_call("postgres", dsn, lambda c, t=task: c.wait(t.id, timeout_ms=30_000))
        assert done.status == "succeeded"
        ran.append(done.worker_id)
    return ran


def settled_empty_wakes(daemon: Daemon) -> int:
    """The children's count of claims that found nothing, once their heartbeats (every
    100 ms) have said the same for a while."""
    seen: list[tuple[float, int]] = []

    def steady() -> int | None:
        now, total = time.monotonic(), sum(c["empty_wakes"] for c in children(daemon))
        if not seen or seen[-1][1] != total:
            seen.append((now, total))
            return None
        return total if now - seen[-1][0] > 1.0 else None

    return wait_for("the empty-wake counts to settle", steady, timeout=30) or 0


@pytest.mark.slow
def test_wakes_take_turns_and_claims_come_up_empty_rarely(tmp_path: Path, pg_dsn: str) -> None:
    config = config_for(tmp_path / "a", pg_dsn, relayed=True, concurrency=4)
    with serving(tmp_path / "a", config) as daemon:
        wait_for("both children to report room", lambda: all(c["room"] for c in children(daemon)))
        before = settled_empty_wakes(daemon)
        ran = one_at_a_time(pg_dsn, TASKS)
        routed_empty = settled_empty_wakes(daemon) - before
        ids = {c["worker_id"] for c in children(daemon)}
    by_child = Counter(ran)
    assert set(by_child) == ids  # both children got work
    assert min(by_child.values()) >= TASKS // 4, by_child
    # Each child hearing every notification, both claimed on each and one found
    # nothing: TASKS empty claims (tests/daemon/test_wake_role.py has the same count
    # for children that LISTEN, one at a time answering).
    assert routed_empty <= TASKS // 4, routed_empty


@pytest.mark.slow
@pytest.mark.timing
def test_a_task_goes_to_the_child_with_a_free_slot(tmp_path: Path, pg_dsn: str) -> None:
    config = config_for(tmp_path / "d", pg_dsn, relayed=True, concurrency=2)
    release = tmp_path / "release"
    with serving(tmp_path / "d", config) as daemon:
        wait_for("both children to report room", lambda: all(c["room"] for c in children(daemon)))
        # Three blocking tasks, one at a time: turns give one child two (its slots
        # all taken) and the other one (a slot free).
        holders: Counter[str] = Counter()
        for _ in range(3):
            task = run_one(pg_dsn, "t.block", {"until": str(release)})
            running = wait_for(
                "the task to start",
                lambda t=task: get(pg_dsn, t.id),
                timeout=30,
                accept=lambda found: found.status == "running",
            )
            holders[running.worker_id] += 1
        (full,) = [w for w, n in holders.items() if n == 2]
        (free,) = [w for w, n in holders.items() if n == 1]
        wait_for(
            "the full child to report no room",
            lambda: (
                {c["worker_id"]: c["room"] for c in children(daemon)} == {full: False, free: True}
            ),
        )
        pickups = []
        for i in range(6):
            submitted = time.monotonic()
            task = run_one(pg_dsn, "t.echo", {"i": i})
            done = client_call(
                "postgres", pg_dsn, lambda c, t=task: c.wait(t.id, timeout_ms=30_000)
            )
            pickups.append(time.monotonic() - submitted)
            assert done.status == "succeeded" and done.worker_id == free
        release.touch()
    # A task routed to the full child would wait for the 10 s poll.
    assert max(pickups) < 2.0, pickups
