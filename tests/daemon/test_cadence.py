"""The parent's loop sleeps up to a second when all is steady (`cadence.py`), and still
acts on time: a silent child, a killed child, a stop, the systemd watchdog, and a
parent that was itself stopped. Real daemons on SQLite (the loop's timing does not
touch the store)."""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.support.daemon import Daemon, base_config, gone
from tests.support.harness import client_call, database_section, wait_running
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timing]


def config_for(tmp_path: Path, sqlite_path: str, processes: int = 2) -> dict[str, Any]:
    groups = {"g": {"queues": ["q"], "processes": processes, "concurrency": 1, "lease": "60s"}}
    config = base_config(tmp_path, database_section("sqlite", sqlite_path), groups)
    config["supervisor"].update(heartbeat_timeout="2s", heartbeat_interval="500ms")
    return config


def loop_status(daemon: Daemon) -> dict[str, Any]:
    """The snapshot's `loop`: ticks so far, and what the last plan was for."""
    loop: dict[str, Any] = daemon.snapshot()["loop"]
    return loop


def steady(daemon: Daemon) -> dict[str, Any]:
    return wait_for(
        "the loop to plan idle ticks",
        lambda: loop_status(daemon),
        accept=lambda loop: loop["planned_for"] == "idle",
    )


def logged_within(daemon: Daemon, text: str, since: float, timeout: float) -> float:
    """Seconds from `since` until `text` shows in the daemon's log."""
    wait_for(repr(text), lambda: text in daemon.output(), timeout)
    return time.monotonic() - since


def test_an_idle_parent_runs_its_steps_about_once_a_second(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    daemon = daemon_factory(config_for(tmp_path, sqlite_path)).start()
    first = steady(daemon)["ticks"]
    started = time.monotonic()
    # The children's heartbeats (every 500 ms each) and task events need no tick.
    ticked = wait_for(
        "six more ticks",
        lambda: loop_status(daemon),
        timeout=30,
        accept=lambda loop: loop["ticks"] >= first + 6,
    )
    elapsed = time.monotonic() - started
    rate = (ticked["ticks"] - first) / elapsed
    assert rate <= 2.0, f"{rate:.1f} ticks/s when idle"
    assert "stalled" not in daemon.output()
    assert daemon.stop() == 0


def test_a_silent_child_is_aborted_at_its_heartbeat_timeout(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    daemon = daemon_factory(config_for(tmp_path, sqlite_path)).start()
    steady(daemon)
    victim, other = sorted(daemon.children("g"))
    silenced = time.monotonic()
    os.kill(victim, signal.SIGSTOP)
    # Heard last at most one heartbeat (500 ms) before it stopped: aborted 1.5-2 s on.
    took = logged_within(daemon, f"child {victim} of g: silent for longer", silenced, 30)
    assert 1.0 < took < 2.7, f"aborted {took:.1f}s after it went silent (timeout 2 s)"
    # Stopped, it cannot take the SIGABRT; the SIGKILL 5 s later ends it.
    wait_for(
        "the silent child to be replaced",
        lambda: victim not in (now := daemon.children("g")) and len(set(now) - {other}) == 1,
        30,
    )
    assert daemon.stop() == 0


def test_a_killed_child_is_restarted_after_its_backoff(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(tmp_path, sqlite_path)
    # The first restart waits 300-600 ms: an idle tick (1 s) would be late for it.
    config["supervisor"]["backoff_max"] = "600ms"
    daemon = daemon_factory(config).start()
    steady(daemon)
    victim = min(daemon.children("g"))
    spawned = daemon.output().count("spawned g/")
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    wait_for("the replacement", lambda: daemon.output().count("spawned g/") > spawned, 10)
    took = time.monotonic() - killed
    assert took < 1.0, f"respawned {took:.2f}s after the kill (backoff at most 600 ms)"
    wait_for("the pool at size", lambda: len(daemon.children("g")) == 2 and gone(victim))
    assert daemon.stop() == 0


def test_a_stop_cuts_a_drain_at_its_shutdown_timeout(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(tmp_path, sqlite_path, processes=1)
    config["shutdown_timeout"] = "2s"
    daemon = daemon_factory(config).start()

    async def submit(c: CairnQ) -> Any:
        return await c.submit("t.block", {"until": str(tmp_path / "never")}, queue="q")

    task = client_call("sqlite", sqlite_path, submit)
    wait_running("sqlite", sqlite_path, task.id)
    steady(daemon)
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc is not None
    assert daemon.proc.wait(timeout=30) == 0, daemon.output()
    took = time.monotonic() - started
    assert 1.5 < took < 5.0, f"stopped {took:.1f}s after SIGTERM (shutdown_timeout 2 s)"
    assert "still draining at its shutdown_timeout" in daemon.output()


def test_the_watchdog_is_pinged_every_half_period_between_idle_ticks(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    # WatchdogSec=1s: systemd wants a ping within every second; the parent pings at half.
    daemon = daemon_factory(config_for(tmp_path, sqlite_path))
    daemon.start(env={"WATCHDOG_USEC": "1000000"})
    steady_at = len(daemon.messages)
    pings: list[float] = []

    def ping_times() -> list[float]:
        nonlocal steady_at
        daemon.poll_notify()
        now = time.monotonic()
        pings.extend(now for m in daemon.messages[steady_at:] if m == "WATCHDOG=1")
        steady_at = len(daemon.messages)
        return pings

    wait_for("ten pings", ping_times, 30, accept=lambda seen: len(seen) >= 10)
    # The first ping's time is when the test first looked, not when it came.
    gaps = [b - a for a, b in itertools.pairwise(pings[1:])]
    assert max(gaps) < 0.85, f"pings {', '.join(f'{g:.2f}' for g in gaps)} s apart"
    assert daemon.stop() == 0


def test_a_parent_stopped_with_its_children_does_not_blame_them(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    # The whole host froze (a VM paused, a laptop's lid): nobody heard from anybody.
    # The parent, thawed first, sees the children silent past heartbeat_timeout; its
    # loop ran late, so the silence is its own and it forgives it.
    daemon = daemon_factory(config_for(tmp_path, sqlite_path)).start()
    steady(daemon)
    children = set(daemon.children("g"))
    for pid in children:
        os.kill(pid, signal.SIGSTOP)
    daemon.signal(signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        wait_for("the freeze to outlast heartbeat_timeout (2 s)",
                 lambda: time.monotonic() - frozen > 3.0, 10)  # fmt: skip
    finally:
        daemon.signal(signal.SIGCONT)
    try:
        logged_within(daemon, "the supervisor loop stalled for", frozen, 10)
    finally:
        for pid in children:
            os.kill(pid, signal.SIGCONT)
    ticks = loop_status(daemon)["ticks"]
    wait_for("three more ticks", lambda: loop_status(daemon)["ticks"] >= ticks + 3, 30)
    assert "silent for longer" not in daemon.output()
    assert set(daemon.children("g")) == children
    assert daemon.stop() == 0
