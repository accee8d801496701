"""One child of a group answers wake-ups: the one holding the group's wake lock while it
has room (daemon/wakerole.py). The others take over when it fills up, stops or dies, so
a task never waits for the poll while a child of the group has a free slot; and a
wake-up no longer has every child claim, all but one finding nothing.

The lock itself is tried with real processes holding and dying; the daemon's side with
real daemons on both dialects, their poll intervals far longer than any wait asserted,
so every pickup here came from a wake-up or a hand-over of the role."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cairnqd.daemon.wakerole import WakeRole
from tests.support.daemon import Daemon, base_config, gone
from tests.support.harness import client_call, database_section
from tests.support.waiting import wait_for, wait_for_async

#: Far longer than any pickup asserted below: none of them comes from a poll.
POLL = "60s"
PICKUP_S = 15.0

# -- the lock, between real processes ------------------------------------------------------

_HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""

_TRY = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(1)
"""


def free_elsewhere(path: Path) -> bool:
    """Another process could take the lock now."""
    return subprocess.run([sys.executable, "-c", _TRY, str(path)], check=False).returncode == 0


@contextmanager
def held_elsewhere(path: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


async def test_a_child_with_room_holds_the_role_and_lets_go_when_full(tmp_path: Path) -> None:
    path = tmp_path / "wake"
    claiming = True
    role = WakeRole(str(path), lambda: claiming)
    role.start(asyncio.get_running_loop())
    try:
        role.slots(True)
        await role.until_held(10)
        assert role.holding and not free_elsewhere(path)
        role.slots(False)  # every call slot taken
        await wait_for_async("the role let go", lambda: not role.holding)
        assert free_elsewhere(path)
        role.slots(True)
        await role.until_held(10)
        assert role.holding
        claiming = False  # a quiet or a drain: no claims, so no wake-ups either
        role.check()
        await wait_for_async("the role let go", lambda: not role.holding)
        assert free_elsewhere(path)
    finally:
        role.close()


async def test_a_holder_full_for_a_moment_keeps_the_role(tmp_path: Path) -> None:
    path = tmp_path / "wake"
    role = WakeRole(str(path), lambda: True)
    # Far longer than the test's own turns take: every look below falls inside it.
    role.let_go_after_s = 5.0
    role.start(asyncio.get_running_loop())
    try:
        role.slots(True)
        await role.until_held(10)
        role.slots(False)  # a claim filled every slot...
        await wait_for_async("the look to see it full", lambda: role._full_since is not None)
        assert role.holding and not free_elsewhere(path)
        role.slots(True)  # ...and its short calls ended
        await wait_for_async("the look to see room", lambda: role._full_since is None)
        # Letting go at once, a sibling woken for the role would have claimed the
        # tasks that came meanwhile, filled up in turn, and handed it back.
        assert role.holding and not free_elsewhere(path)
        role.let_go_after_s = 0.2
        role.slots(False)
        full_at = time.monotonic()
        await wait_for_async("the role let go", lambda: not role.holding)
        assert time.monotonic() - full_at >= 0.2
        assert free_elsewhere(path)
    finally:
        role.close()


async def test_a_sibling_takes_the_role_when_its_holder_dies(tmp_path: Path) -> None:
    path = tmp_path / "wake"
    role = WakeRole(str(path), lambda: True)
    role.start(asyncio.get_running_loop())
    try:
        with held_elsewhere(path) as holder:
            role.slots(True)
            await role.until_held(1.0)
            assert not role.holding  # the other process has it
            holder.send_signal(signal.SIGKILL)
            await role.until_held(30)
            assert role.holding
    finally:
        role.close()
    assert free_elsewhere(path)  # closed: let go at once


def test_a_process_forked_by_a_handler_does_not_keep_the_role(tmp_path: Path) -> None:
    """A handler that forks (multiprocessing's default on Linux) copies the child's file
    descriptors, and a lock is the open file's: the copy would hold the role after the
    child died, and the group would answer wake-ups only through its poll."""
    path = tmp_path / "wake"
    script = textwrap.dedent(
        """
        import asyncio, os, sys, time
        from cairnqd.daemon.wakerole import WakeRole

        async def main():
            role = WakeRole(sys.argv[1], lambda: True)
            role.start(asyncio.get_running_loop())
            role.slots(True)
            await role.until_held(10)
            assert role.holding
            pid = os.fork()
            if pid == 0:
                time.sleep(600)
                os._exit(0)
            print(pid, flush=True)
            await asyncio.sleep(600)

        asyncio.run(main())
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    try:
        assert not free_elsewhere(path)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not gone(grandchild)
        assert free_elsewhere(path)
    finally:
        os.kill(grandchild, signal.SIGKILL)
        proc.kill()
        proc.wait()
        proc.stdout.close()


# -- the daemon ------------------------------------------------------------------------------


def config_for(tmp: Path, dialect: str, target: str, *, concurrency: int) -> dict[str, Any]:
    group = {
        "queues": ["q"],
        "processes": 2,
        "concurrency": concurrency,
        "prefetch": 0,
        "poll_interval": POLL,
    }
    config = base_config(tmp, database_section(dialect, target), {"g": group})
    config["supervisor"]["heartbeat_interval"] = "100ms"
    return config


def children(daemon: Daemon) -> list[dict[str, Any]]:
    """The group's ready children, as `cairnqd status --json` shows them."""
    (group,) = [g for g in daemon.snapshot()["groups"] if g["name"] == "g"]
    return [c for c in group["children"] if c["state"] == "ready"]


def submit(dialect: str, target: str, name: str, payload: dict[str, Any]) -> str:
    async def go(c: Any) -> str:
        return str((await c.submit(name, payload, queue="q")).id)

    return str(client_call(dialect, target, go))


def get(dialect: str, target: str, task_id: str) -> Any:
    return client_call(dialect, target, lambda c: c.get(task_id))


def started(dialect: str, target: str, task_id: str) -> Any:
    """The task, once it runs or ran; its worker id tells which child took it."""
    return wait_for(
        f"task {task_id} to start",
        lambda: get(dialect, target, task_id),
        timeout=PICKUP_S,
        accept=lambda t: t.status in ("running", "succeeded"),
    )


def settled_empty_wakes(daemon: Daemon) -> dict[str, int]:
    """Each child's count of claims that found nothing, by worker id, once their
    heartbeats (every 100 ms) have said the same for a second."""
    seen: list[tuple[float, dict[str, int]]] = []

    def steady() -> dict[str, int] | None:
        now = time.monotonic()
        counts = {c["worker_id"]: c["empty_wakes"] for c in children(daemon)}
        if not seen or seen[-1][1] != counts:
            seen.append((now, counts))
            return None
        return counts if now - seen[-1][0] > 1.0 else None

    counts: dict[str, int] = wait_for("the empty-wake counts to settle", steady, timeout=30)
    return counts


@pytest.fixture
def two_children(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> Iterator[Any]:
    def start(concurrency: int) -> Daemon:
        daemon = daemon_factory(config_for(tmp_path, dialect, db_target, concurrency=concurrency))
        daemon.start()
        wait_for("both children ready", lambda: len(children(daemon)) == 2, timeout=60)
        return daemon

    yield start


@pytest.mark.slow
@pytest.mark.timing
def test_one_child_answers_each_wake_up(dialect: str, db_target: str, two_children: Any) -> None:
    daemon = two_children(4)
    before = settled_empty_wakes(daemon)
    for i in range(12):
        task_id = submit(dialect, db_target, "t.echo", {"i": i})
        done = client_call(dialect, db_target, lambda c, t=task_id: c.wait(t, timeout_ms=30_000))
        assert done.status == "succeeded"
    after = settled_empty_wakes(daemon)
    # With every child claiming on every wake-up, both came up empty again and again:
    # 4 and 8 times on Postgres, 15 and 27 on SQLite (which wakes on any commit, the
    # daemon's own writes too). Now the child holding the role answers, and its
    # sibling, waiting for the role, claims on nothing but its poll.
    empty = {w: after[w] - before.get(w, 0) for w in after}
    assert min(empty.values()) <= 1, empty
    if dialect == "postgres":
        assert sum(empty.values()) <= 2, empty  # each notification found its task


@pytest.mark.slow
@pytest.mark.timing
def test_a_full_child_hands_the_wake_ups_to_its_sibling(
    tmp_path: Path, dialect: str, db_target: str, two_children: Any
) -> None:
    daemon = two_children(1)
    first_release, second_release = tmp_path / "first", tmp_path / "second"
    first = started(
        dialect, db_target, submit(dialect, db_target, "t.block", {"until": str(first_release)})
    )
    # Its child is full now: the other one answers, within the poll's sixtieth.
    second = started(
        dialect, db_target, submit(dialect, db_target, "t.block", {"until": str(second_release)})
    )
    assert second.worker_id != first.worker_id
    # Both full: a third waits until a slot frees, then starts at once.
    third_id = submit(dialect, db_target, "t.echo", {"i": 3})
    first_release.touch()
    third = started(dialect, db_target, third_id)
    assert third.worker_id == first.worker_id
    second_release.touch()
    assert {c["worker_id"] for c in children(daemon)} == {first.worker_id, second.worker_id}


@pytest.mark.slow
@pytest.mark.timing
def test_a_killed_holder_hands_the_role_over(
    dialect: str, db_target: str, two_children: Any
) -> None:
    daemon = two_children(2)
    # The child that answers takes a task the moment it is submitted.
    holder = started(dialect, db_target, submit(dialect, db_target, "t.echo", {"i": 0})).worker_id
    (pid,) = [c["pid"] for c in children(daemon) if c["worker_id"] == holder]
    os.kill(pid, signal.SIGKILL)
    wait_for("the holder to die", lambda: gone(pid))
    # Its replacement (the same worker id) is up before the next task: the sibling,
    # blocked on the lock, took the role the moment the holder died.
    wait_for("the replacement ready", lambda: len(children(daemon)) == 2, timeout=60)
    task = started(dialect, db_target, submit(dialect, db_target, "t.echo", {"i": 1}))
    assert task.worker_id != holder
