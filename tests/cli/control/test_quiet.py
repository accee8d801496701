"""SIGTSTP quiets the whole daemon on this host; a plain reload ends the quiet."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.support.harness import client_call, control_config
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def _submit(db: str) -> str:
    async def go(c: CairnQ) -> str:
        return (await c.submit("t.echo", {"x": 1}, queue="a")).id

    return client_call("sqlite", db, go)  # type: ignore[no-any-return]


def _status(db: str, task_id: str) -> str:
    async def go(c: CairnQ) -> str:
        task = await c.get(task_id)
        assert task is not None
        return task.status

    return client_call("sqlite", db, go)  # type: ignore[no-any-return]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _quiet_states(daemon: Any) -> tuple[bool, set[str]]:
    done = daemon.cli("status", "--json")
    assert done.returncode == 0, done.stderr
    snap = json.loads(done.stdout)
    return snap["quiet"], {c["state"] for g in snap["groups"] for c in g["children"]}


@pytest.mark.parametrize("change", [False, True], ids=["unchanged", "changed"])
def test_a_reload_after_sigtstp_resumes_claiming(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any, change: bool
) -> None:
    config = control_config(tmp_path, "sqlite", sqlite_path, {"g": {"queues": ["a"]}})
    daemon = daemon_factory(config).start()
    children = set(daemon.children("g"))
    daemon.signal(signal.SIGTSTP)
    wait_for(
        "every child to go quiet", lambda: all("quiet" in t for t in daemon.children("g").values())
    )
    wait_for("status to say quiet", lambda: _quiet_states(daemon) == (True, {"quiet"}))
    task_id = _submit(sqlite_path)
    cpu_before = {pid: _cpu_seconds(pid) for pid in children}
    time.sleep(1.5)  # a quiet daemon must leave it alone; give it the chance not to
    assert _status(sqlite_path, task_id) == "queued"
    # Quiet is idle: a quiet child's claim loop once spun on a wake-up it never cleared.
    for pid, before in cpu_before.items():
        assert _cpu_seconds(pid) - before < 0.5, f"quiet child {pid} kept a core busy"
    if change:
        config["logging"] = {"level": "debug"}  # a hot change: no child is replaced
        daemon.write_config(config)
    done = daemon.cli("reload", "--wait", "30s")
    assert done.returncode == 0, done.stderr
    wait_for(
        "the task to run after the reload", lambda: _status(sqlite_path, task_id) == "succeeded"
    )
    assert set(daemon.children("g")) == children  # the same children, claiming again
    assert "ending the SIGTSTP quiet" in daemon.output()
    wait_for("status to say ready", lambda: _quiet_states(daemon) == (False, {"ready"}))
    assert daemon.stop() == 0


def test_a_child_replaced_during_the_quiet_stays_quiet(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = control_config(tmp_path, "sqlite", sqlite_path, {"g": {"queues": ["a"]}})
    daemon = daemon_factory(config).start()
    daemon.signal(signal.SIGTSTP)
    wait_for("the child to go quiet", lambda: _quiet_states(daemon) == (True, {"quiet"}))
    (old,) = daemon.children("g")
    os.kill(old, signal.SIGKILL)
    wait_for(
        "a replacement, quiet from the start",
        lambda: (kids := daemon.children("g")) and old not in kids and "quiet" in str(kids),
        60,
    )
    task_id = _submit(sqlite_path)
    time.sleep(1.5)  # give the new child the chance not to claim
    assert _status(sqlite_path, task_id) == "queued"
    assert daemon.cli("reload", "--wait", "30s").returncode == 0
    wait_for(
        "the task to run after the reload", lambda: _status(sqlite_path, task_id) == "succeeded"
    )
    assert daemon.stop() == 0
