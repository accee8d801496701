"""What a handler starts is stopped with its child: each child leads a process group,
and the parent ends what is left in it when the child ends (a stop, a crash).

SQLite only: these exercise the supervisor's process handling, not the store.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.support.daemon import base_config, gone
from tests.support.harness import client_call, database_section, wait_running
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

HANDLERS = "tests.daemon.process_handlers:registry"


def config_for(tmp_path: Path, db: str) -> dict[str, Any]:
    group = {"queues": ["q"], "processes": 1, "concurrency": 2, "handlers": [HANDLERS]}
    return base_config(tmp_path, database_section("sqlite", db), {"g": group})


def submit(db: str, name: str, payload: dict[str, Any]) -> Any:
    async def go(c: CairnQ) -> Any:
        return await c.submit(name, payload, queue="q", max_attempts=1)

    return client_call("sqlite", db, go)


def started(pids_file: Path, n: int) -> list[int]:
    """The `n` pids the handlers wrote, once each runs what it was told to (a shell
    that traps TERM has exec'd its sleep)."""

    def sleeping() -> list[int] | None:
        text = pids_file.read_text() if pids_file.exists() else ""
        pids = [int(line) for line in text.split()]
        if len(pids) < n:
            return None
        for pid in pids:
            if Path(f"/proc/{pid}/cmdline").read_bytes() != b"sleep\x001000\x00":
                return None
        return pids

    return wait_for(f"{n} sleeping processes", sleeping, timeout=60)


def test_stopping_the_daemon_ends_what_its_handlers_started(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    daemon = daemon_factory(config_for(tmp_path, sqlite_path)).start()
    pids_file = tmp_path / "pids"
    task = submit(sqlite_path, "p.start", {"pids": str(pids_file), "stubborn": True})
    done = client_call("sqlite", sqlite_path, lambda c: c.wait(task.id, timeout_ms=30_000))
    assert done.status == "succeeded", done
    pids = started(pids_file, 2)
    assert daemon.stop() == 0, daemon.output()
    # The one that ignores SIGTERM gets SIGKILL a grace period later.
    wait_for("the handler's processes to end", lambda: all(gone(p) for p in pids), timeout=30)


def test_a_crashed_child_leaves_nothing_running(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    daemon = daemon_factory(config_for(tmp_path, sqlite_path)).start()
    pids_file = tmp_path / "pids"
    (child,) = daemon.children("g")
    submit(sqlite_path, "p.crash", {"pids": str(pids_file), "stubborn": True})
    wait_for("the child to crash", lambda: gone(child), timeout=60)
    pids = [int(line) for line in pids_file.read_text().split()]
    assert len(pids) == 2
    wait_for("the crashed child's processes to end", lambda: all(gone(p) for p in pids), 30)
    assert "died (exit 3)" in daemon.output()
    assert daemon.stop() == 0


def test_ctrl_c_still_drains_and_in_flight_processes_run_to_the_end(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    """The terminal's SIGINT goes to the daemon's foreground group, which no child is
    in any more: the parent drains as before, and a task still running keeps what it
    started until it is done."""
    daemon = daemon_factory(config_for(tmp_path, sqlite_path)).start(own_group=True)
    pids_file, release = tmp_path / "pids", tmp_path / "release"
    task = submit(sqlite_path, "p.start", {"pids": str(pids_file), "until": str(release)})
    wait_running("sqlite", sqlite_path, task.id)
    (sleeper,) = started(pids_file, 1)
    (child,) = daemon.children("g")
    assert os.getpgid(child) == child != os.getpgid(daemon.pid)
    assert os.getpgid(sleeper) == child
    mark = len(daemon.messages)
    os.killpg(daemon.pid, signal.SIGINT)  # what Ctrl-C does
    daemon.wait_notify("STOPPING=1", start=mark)
    wait_for("the child to drain", lambda: "draining" in daemon.children("g").get(child, ""))
    assert not gone(sleeper), "a drain ended a running task's process"
    release.touch()
    assert daemon.proc is not None
    assert daemon.proc.wait(timeout=60) == 0, daemon.output()
    done = client_call("sqlite", sqlite_path, lambda c: c.get(task.id))
    assert done.status == "succeeded", done
    wait_for("the handler's process to end", lambda: gone(sleeper), timeout=30)
