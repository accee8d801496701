"""The runtime directory against another local user: the real daemon and CLI.

Without RUNTIME_DIRECTORY or XDG_RUNTIME_DIR the daemon's lock and state live in
$TMPDIR/cairnqd-<uid>, a name anyone can create first. These tests plant what such a
user could (a directory, a symlink, a state file naming another process) and check
that nothing of theirs is followed, trusted or signalled. The tests that chown need
root; the rest run as anyone.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cairnqd.daemon.parent.statefile import StateFile, initial_state, state_path
from tests.support.cli import REPO, run_cli
from tests.support.daemon import base_config
from tests.support.harness import database_section

pytestmark = pytest.mark.slow

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def write_config(tmp_path: Path, *, runtime_dir: str | None) -> Path:
    config = base_config(tmp_path, database_section("sqlite", str(tmp_path / "tasks.db")),
                         {"g": {"queues": ["q"]}})  # fmt: skip
    if runtime_dir is None:
        del config["runtime_dir"]
    else:
        config["runtime_dir"] = runtime_dir
    path = tmp_path / "cairnq.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def cairnqd(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v for k, v in os.environ.items() if k not in ("RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR")
    }
    return run_cli(*args, cwd=tmp_path, env={**environ, "PYTHONPATH": str(REPO), **env})


@needs_root
def test_a_fallback_directory_planted_by_another_user_is_refused(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    planted = temp / f"cairnqd-{os.geteuid()}"
    planted.mkdir(mode=0o700)
    os.chown(planted, NOBODY, NOBODY)
    path = write_config(tmp_path, runtime_dir=None)
    done = cairnqd(tmp_path, "-c", str(path), TMPDIR=str(temp))
    assert done.returncode == 78, done.stderr
    assert f"runtime directory {planted} belongs to uid {NOBODY}" in done.stderr
    assert os.listdir(planted) == []


def test_a_runtime_directory_others_may_write_to_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "shared"
    run.mkdir()
    run.chmod(0o777)
    path = write_config(tmp_path, runtime_dir=str(run))
    done = cairnqd(tmp_path, "-c", str(path))
    assert done.returncode == 78, done.stderr
    assert "is writable by group or others (mode 0777)" in done.stderr
    assert os.listdir(run) == []


def test_a_symlink_planted_as_the_lock_file_clobbers_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    path = write_config(tmp_path, runtime_dir=str(run))
    victim = tmp_path / "victim.txt"
    victim.write_text("a file the daemon's user can write\n")
    lock = StateFile(state_path(path, str(run))).lock_path
    os.symlink(victim, lock)
    done = cairnqd(tmp_path, "-c", str(path))
    assert done.returncode == 78, done.stderr
    assert "is a symlink: refusing to follow it" in done.stderr
    assert victim.read_text() == "a file the daemon's user can write\n"


def test_reload_does_not_signal_a_process_a_state_file_names(tmp_path: Path) -> None:
    """A state file (ours, lock held) naming a process that is no cairnqd master for
    this config: `reload` refuses, and the process lives on (SIGHUP would end it)."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    path = write_config(tmp_path, runtime_dir=str(run))
    statefile = StateFile(state_path(path, str(run)))
    with subprocess.Popen(["sleep", "60"]) as bystander:
        try:
            state: dict[str, Any] = {**initial_state(path), "pid": bystander.pid}
            Path(statefile.path).write_text(json.dumps(state))
            os.chmod(statefile.path, 0o600)
            fd = os.open(statefile.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)  # the lock is held: no "stale" shortcut
            try:
                done = cairnqd(tmp_path, "-c", str(path), "reload", "--wait", "5s")
            finally:
                os.close(fd)
            assert done.returncode == 69, done.stderr
            assert f"pid {bystander.pid} is not the cairnqd master for" in done.stderr
            assert bystander.poll() is None, "the bystander got the signal"
        finally:
            bystander.kill()


def test_files_the_daemon_creates_are_its_user_s_alone(tmp_path: Path, daemon_factory: Any) -> None:
    config = base_config(tmp_path, database_section("sqlite", str(tmp_path / "tasks.db")),
                         {"g": {"queues": ["q"]}})  # fmt: skip
    config["logging"] = {"file": str(tmp_path / "cairnqd.log")}
    daemon = daemon_factory(config).start()
    (state,) = (tmp_path / "run").glob("cairnqd-*.json")
    for created in (tmp_path / "tasks.db", tmp_path / "cairnqd.log", state):
        assert stat.S_IMODE(created.stat().st_mode) == 0o600, created
    assert daemon.stop() == 0
