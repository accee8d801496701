"""Signals that reach the parent while it starts: before its first child exists.

Before any child is spawned the parent checks the database and imports every group's
handlers in a probe process (`preflight`), which takes as long as those imports take.
A reload (HUP), a log rotation (USR1) or a stop (TERM) can arrive meanwhile; each must
mean what it means once the daemon runs, never kill it or leave the probe behind.
The handlers here hold their import until the test opens a gate file, so the test
signals the parent while the probe certainly runs. SQLite only: this is the parent's.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Daemon, base_config, gone
from tests.support.harness import client_call, database_section
from tests.support.processes import children_running
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

GATED = "tests.daemon.gated_boot_handlers:registry"
PROBE = "cairnqd.daemon.handler_probe"


def start_gated(tmp_path: Path, sqlite_path: str, daemon_factory: Any) -> tuple[Daemon, Path]:
    """A daemon held in its preflight by the gate (returned, still closed)."""
    gate = tmp_path / "gate"
    groups = {"g": {"queues": ["q"], "processes": 1, "handlers": [GATED]}}
    daemon = daemon_factory(base_config(tmp_path, database_section("sqlite", sqlite_path), groups))
    daemon.start(wait_ready=False, env={"CAIRNQD_TEST_BOOT_GATE": str(gate)})
    return daemon, gate


def the_probe(daemon: Daemon) -> int:
    def probe() -> int | None:
        assert daemon.proc is not None
        if daemon.proc.poll() is not None:
            raise AssertionError(f"daemon exited {daemon.proc.returncode}:\n{daemon.output()}")
        found = children_running(daemon.pid, PROBE)
        return found[0] if found else None

    return wait_for("the parent's handler import probe", probe, timeout=60)


def test_a_reload_and_a_log_reopen_while_the_daemon_starts_do_not_kill_it(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    daemon, gate = start_gated(tmp_path, sqlite_path, daemon_factory)
    the_probe(daemon)
    daemon.signal(signal.SIGHUP)
    daemon.signal(signal.SIGUSR1)
    gate.touch()
    daemon.wait_notify("READY=1", timeout=60)
    # The reload asked for during the start is done once the daemon runs.
    reload = wait_for(
        "the reload asked for during the start",
        lambda: daemon.state()["reload"],
        timeout=60,
        accept=lambda r: r["seq"] >= 1,
    )
    assert reload["ok"], reload
    assert client_call("sqlite", sqlite_path, lambda c: c.call("gated.echo", 5, queue="q")) == 5
    assert daemon.stop() == 0, daemon.output()


def test_a_stop_while_the_daemon_starts_ends_the_probe_and_exits_cleanly(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    daemon, _gate = start_gated(tmp_path, sqlite_path, daemon_factory)
    probe = the_probe(daemon)
    daemon.signal(signal.SIGTERM)  # the gate stays shut: the probe would wait forever
    assert daemon.proc is not None
    code = daemon.proc.wait(timeout=60)
    output = daemon.output()
    assert code == 0, output
    assert "SIGTERM while starting" in output, output
    assert "spawned" not in output, output
    wait_for(f"the probe {probe} to end with the parent", lambda: gone(probe), timeout=30)


def test_a_parent_killed_while_it_starts_leaves_no_probe_behind(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    daemon, _gate = start_gated(tmp_path, sqlite_path, daemon_factory)
    probe = the_probe(daemon)
    os.kill(daemon.pid, signal.SIGKILL)
    wait_for(f"the probe {probe} to end with the parent", lambda: gone(probe), timeout=30)
