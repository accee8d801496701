"""`cairnqd stop` against a real daemon: TERM (a drain) or QUIT (`--now`), then a wait
until the daemon and its children have exited, bounded by the drain's own deadline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.support.cli import REPO_ENV
from tests.support.harness import client_call, control_config, wait_running

pytestmark = pytest.mark.slow


def _submit_block(db: str, release: Path) -> str:
    async def go(c: CairnQ) -> str:
        return (await c.submit("t.block", {"until": str(release)}, queue="a")).id

    return client_call("sqlite", db, go)  # type: ignore[no-any-return]


def _task(db: str, task_id: str) -> Any:
    return client_call("sqlite", db, lambda c: c.get(task_id))


def _config(tmp_path: Path, sqlite_path: str) -> dict[str, Any]:
    return control_config(tmp_path, "sqlite", sqlite_path, {"g": {"queues": ["a"]}})


def test_stop_drains_the_running_task_and_returns_once_the_daemon_is_gone(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    daemon = daemon_factory(_config(tmp_path, sqlite_path)).start()
    release = tmp_path / "release"
    task_id = _submit_block(sqlite_path, release)
    wait_running("sqlite", sqlite_path, task_id)

    # The drain cannot end while the task blocks: a short wait says so and names --now.
    early = daemon.cli("stop", "--wait", "500ms")
    assert early.returncode == 75, early.stderr
    assert f"cairnqd (pid {daemon.pid}) still running 0.5s after SIGTERM" in early.stderr
    assert "stop --now" in early.stderr
    assert daemon.proc.poll() is None  # draining, not gone

    # A second stop, with the default wait, returns once the task has ended the drain.
    stopping = subprocess.Popen(
        [sys.executable, "-m", "cairnqd.cli", "-c", str(daemon.config_path), "stop"],
        cwd=daemon.tmp,
        env=REPO_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert stopping.stdout is not None
    first = stopping.stdout.readline()  # printed once the signal is sent
    # shutdown_timeout is 10s in the test config: the wait is bounded by it and what the
    # stop takes after it (STOP_MARGIN_S).
    assert first == f"sent SIGTERM to cairnqd (pid {daemon.pid}): draining; waiting up to 50s\n"
    assert stopping.poll() is None  # still waiting for the drain
    release.touch()
    out, err = stopping.communicate(timeout=60)
    assert stopping.returncode == 0, err
    assert out.startswith(f"stopped: cairnqd (pid {daemon.pid}) exited ")
    # Gone when stop said so, children included, and the task ran to its end.
    assert daemon.proc.poll() == 0
    assert daemon.children("g") == {}
    assert _task(sqlite_path, task_id).status == "succeeded"


def test_stop_now_hands_the_running_task_back(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    daemon = daemon_factory(_config(tmp_path, sqlite_path)).start()
    task_id = _submit_block(sqlite_path, tmp_path / "never")
    wait_running("sqlite", sqlite_path, task_id)

    done = daemon.cli("stop", "--now")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == (
        f"sent SIGQUIT to cairnqd (pid {daemon.pid}): stopping now, running tasks handed "
        "back; waiting up to 50s"
    )
    assert daemon.proc.poll() == 0
    task = _task(sqlite_path, task_id)
    assert (task.status, task.attempt) == ("queued", 0)  # its attempt given back


def test_stop_without_waiting_and_without_a_daemon(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    absent = daemon_factory(_config(tmp_path, sqlite_path))  # its config written, not started
    nobody = absent.cli("stop")
    assert nobody.returncode == 69
    assert f"no cairnqd running for {absent.config_path}" in nobody.stderr

    both = absent.cli("stop", "--no-wait", "--wait", "5s")
    assert both.returncode == 64
    assert "--wait and --no-wait contradict each other" in both.stderr

    daemon = absent.start()
    sent = daemon.cli("stop", "--no-wait")
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout == f"sent SIGTERM to cairnqd (pid {daemon.pid}): draining\n"
    assert daemon.proc.wait(timeout=60) == 0
