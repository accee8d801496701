"""The runtime directory emptied or removed under a running daemon.

The default runtime directory is $XDG_RUNTIME_DIR/cairnqd, which logind removes when
its user's last session ends, and a fallback under $TMPDIR may be cleaned by age. The
daemon's lock, state file and control socket live there: without them `cairnqd
reload`, `status` and `stop` cannot find the daemon, and nothing keeps a second daemon
off the same config. The daemon puts them back by itself. SQLite only: this is the
parent's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import REPO_ENV
from tests.support.daemon import base_config
from tests.support.harness import database_section
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def test_a_removed_runtime_directory_is_put_back_and_still_keeps_a_second_daemon_off(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = base_config(
        tmp_path, database_section("sqlite", sqlite_path), {"g": {"queues": ["q"]}}
    )
    daemon = daemon_factory(config).start()
    run = tmp_path / "run"
    shutil.rmtree(run)

    def restored() -> bool:
        try:
            return bool(daemon.state()["pid"] == daemon.pid)
        except (ValueError, OSError):
            return False

    wait_for("the daemon to write its state file again", restored, timeout=60)
    status = daemon.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    done = daemon.cli("reload", "--wait", "30s")
    assert done.returncode == 0, done.stderr
    # The lock is back too: a second daemon on the same config refuses to run.
    second = subprocess.Popen(
        [sys.executable, "-m", "cairnqd.cli", "-c", str(daemon.config_path)],
        env=REPO_ENV,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = second.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        second.terminate()
        out, _ = second.communicate(timeout=60)
        raise AssertionError(f"a second daemon ran beside the first:\n{out}") from None
    assert second.returncode == 75, out
    assert f"pid {daemon.pid}" in out, out
    assert daemon.proc is not None and daemon.proc.poll() is None
    assert daemon.stop() == 0, daemon.output()
