"""`cairnqd status` asks the running daemon over its control socket."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.support.cli import cli
from tests.support.daemon import write_config
from tests.support.harness import client_call, control_config
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

# Refuses to import while `handlers-broken` exists in the daemon's directory. Broken
# before the start, the daemon would refuse to start at all (its preflight checks).
FLAKY = "tests.daemon.flaky_handlers:registry"


def _submit_blocking(dialect: str, target: str, release: Path, n: int) -> None:
    async def go(c: CairnQ) -> None:
        for _ in range(n):
            await c.submit("t.block", {"until": str(release)}, queue="a")

    client_call(dialect, target, go)


def _status_json(daemon: Any) -> dict[str, Any]:
    done = daemon.cli("status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_status_shows_groups_children_tasks_and_pauses(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    groups = {
        # One slot, prefetch 3: one task executing, others held (claimed ahead).
        "g": {"queues": ["a"], "processes": 1, "concurrency": 1, "prefetch": 3},
        "broken": {"queues": ["z"], "processes": 1, "handlers": [FLAKY]},
    }
    daemon = daemon_factory(control_config(tmp_path, dialect, db_target, groups)).start()
    doomed = wait_for("the broken group's child", lambda: daemon.children("broken"))
    (tmp_path / "handlers-broken").touch()
    for pid in doomed:
        os.kill(pid, signal.SIGKILL)  # its replacement cannot import its handlers
    release = tmp_path / "release"
    _submit_blocking(dialect, db_target, release, 6)
    assert daemon.cli("pause", "--queue", "z", "--reason", "broken import").returncode == 0

    def settled() -> dict[str, Any] | None:
        snap = _status_json(daemon)
        (g,) = [x for x in snap["groups"] if x["name"] == "g"]
        child = g["children"][0] if g["children"] else None
        (broken,) = [x for x in snap["groups"] if x["name"] == "broken"]
        busy = child and child["executing"] == 1 and child["held"] >= 1 and child["longest"]
        if busy and broken["state"] == "fatal":
            return snap
        return None

    snap = wait_for("one executing, some held, a FATAL group", settled, 60)
    assert snap["pid"] == daemon.pid and snap["generation"] == 1 and not snap["quiet"]
    by_name = {g["name"]: g for g in snap["groups"]}
    g, broken = by_name["g"], by_name["broken"]
    (child,) = g["children"]
    assert child["pid"] in daemon.children("g")
    assert child["state"] == "ready" and child["generation"] == 1 and child["rss"] > 0
    assert child["longest"]["name"] == "t.block" and child["longest"]["age_s"] >= 0
    assert broken["state"] == "fatal" and "handlers-broken exists" in broken["fatal_error"]
    assert broken["restarts"] >= 0
    assert [p["queue"] for p in snap["paused_queues"]] == ["z"]

    text = daemon.cli("status")
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert f"cairnqd pid {daemon.pid}, generation 1" in out
    assert "group g: running, 1/1 ready" in out
    assert "group broken: FATAL" in out and "handlers-broken exists" in out
    assert "z (paused " in out and "broken import" in out
    assert "EXECUTING" in out and "HELD" in out and "t.block" in out
    assert "Both count as running in `cairnqd stats`" in out
    release.touch()
    assert daemon.stop() == 0


def test_the_socket_is_private_and_a_silent_client_blocks_nobody(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = control_config(tmp_path, "sqlite", sqlite_path, {"g": {"queues": ["a"]}})
    daemon = daemon_factory(config).start()
    (sock_path,) = (tmp_path / "run").glob("cairnqd-*.sock")
    mode = os.lstat(sock_path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    with socket.socket(socket.AF_UNIX) as silent:
        silent.connect(str(sock_path))  # says nothing; the server gives up on it
        assert _status_json(daemon)["pid"] == daemon.pid
        # The supervisor's loop kept ticking meanwhile: it still answers a reload.
        assert daemon.cli("reload", "--wait", "30s").returncode == 0
    assert daemon.stop() == 0
    assert not sock_path.exists()  # removed on the way out


def test_status_without_a_daemon_says_so(tmp_path: Path, sqlite_path: str) -> None:
    path = write_config(
        tmp_path, control_config(tmp_path, "sqlite", sqlite_path, {"g": {"queues": ["a"]}})
    )
    done = cli(path, "status")
    assert done.returncode == 69
    assert "cannot ask the daemon" in done.stderr and "no control socket" in done.stderr
