"""The daemon's state file: path, atomic writes, validation on read, and the lock."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cairnqd.daemon.parent.runtimedir import UnsafeRuntimeDir
from cairnqd.daemon.parent.statefile import (
    AlreadyRunning,
    StateFile,
    StateFileError,
    after_reload,
    initial_state,
    state_path,
)


def test_state_path_hashes_the_absolute_config_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    relative = state_path("cairnq.yaml", "/run/cairnq")
    absolute = state_path(tmp_path / "cairnq.yaml", "/run/cairnq")
    assert relative == absolute
    name = os.path.basename(absolute)
    assert os.path.dirname(absolute) == "/run/cairnq"
    assert name.startswith("cairnqd-") and name.endswith(".json")
    assert len(name) == len("cairnqd-") + 16 + len(".json")
    assert state_path(tmp_path / "other.yaml", "/run/cairnq") != absolute


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    sf = StateFile(tmp_path / "run" / "cairnqd-x.json")
    assert sf.read() is None
    sf.acquire()
    state = initial_state(tmp_path / "cairnq.yaml")
    sf.write(state)
    assert sf.read() == state
    assert state["pid"] == os.getpid()
    assert state["config"] == str(tmp_path / "cairnq.yaml")
    # The daemon's user's alone (root reads it anyway); no temp file left behind.
    assert stat.S_IMODE(os.stat(sf.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(sf.lock_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "run").st_mode) == 0o700
    assert sorted(os.listdir(tmp_path / "run")) == ["cairnqd-x.json", "cairnqd-x.lock"]
    sf.release()


def test_after_reload_moves_seq_either_way() -> None:
    state = initial_state("/etc/cairnq/cairnq.yaml")
    refused = after_reload(state, ok=False, errors=["f:1:1: boom"], generation=1)
    assert refused["reload"]["seq"] == 1 and not refused["reload"]["ok"]
    assert refused["reload"]["errors"] == ["f:1:1: boom"]
    applied = after_reload(refused, ok=True, errors=[], generation=2)
    assert applied["reload"] == {**applied["reload"], "seq": 2, "ok": True, "errors": []}
    assert applied["generation"] == 2
    assert state["reload"]["seq"] == 0  # the input is not modified


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"pid": 12, "generation"', "not valid JSON at line 1 column 25"),
        ("", "not valid JSON at line 1 column 1"),
        ("[1, 2]", "expected a JSON object"),
        ('{"pid": true, "generation": 1, "config": "c", "reload": {}}', "'pid'"),
        ('{"pid": 1, "generation": 1, "config": "c", "reload": {"seq": 1}}', "'reload.ok'"),
    ],
)
def test_read_rejects_what_is_not_a_state(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "cairnqd-x.json"
    path.write_text(text)
    with pytest.raises(StateFileError, match=expected) as info:
        StateFile(path).read()
    assert str(path) in str(info.value)


def test_second_acquire_raises_already_running_with_the_pid(tmp_path: Path) -> None:
    first = StateFile(tmp_path / "cairnqd-x.json")
    first.acquire()
    # flock belongs to the open file description, so a second open conflicts even in
    # the same process, exactly as a second daemon would.
    second = StateFile(tmp_path / "cairnqd-x.json")
    with pytest.raises(AlreadyRunning) as info:
        second.acquire()
    assert info.value.pid == os.getpid()
    assert "already running" in str(info.value) and first.lock_path in str(info.value)
    assert second.locked_by_other() and not second.held
    first.release()
    assert not second.locked_by_other()
    second.acquire()
    second.release()


def test_release_removes_the_state_but_keeps_the_lock_file(tmp_path: Path) -> None:
    with StateFile(tmp_path / "cairnqd-x.json") as sf:
        sf.write(initial_state("c.yaml"))
    assert not os.path.exists(sf.path)
    assert os.path.exists(sf.lock_path)
    assert sf.read() is None
    sf.release()  # idempotent


def test_lock_is_not_inherited_by_children(tmp_path: Path) -> None:
    """A child spawned while the lock is held must not keep it once the daemon is gone."""
    sf = StateFile(tmp_path / "cairnqd-x.json")
    sf.acquire()
    code = "import time; print('up', flush=True); time.sleep(30)"
    with subprocess.Popen(
        [sys.executable, "-c", code], close_fds=False, stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            # Wait until the child runs Python: Popen returns as soon as exec has closed
            # its error pipe, which may be a moment before the kernel closes the lock fd.
            assert child.stdout is not None and child.stdout.readline() == "up\n"
            sf.release()
            again = StateFile(tmp_path / "cairnqd-x.json")
            again.acquire()
            again.release()
        finally:
            child.kill()


def test_lock_held_by_another_process(tmp_path: Path) -> None:
    path = tmp_path / "cairnqd-x.json"
    code = (
        "import sys, time\n"
        "from cairnqd.daemon.parent.statefile import StateFile\n"
        f"StateFile({str(path)!r}).acquire()\n"
        "print('locked', flush=True)\n"
        "time.sleep(30)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
            with pytest.raises(AlreadyRunning) as info:
                StateFile(path).acquire()
            assert info.value.pid == holder.pid
        finally:
            holder.kill()
    # The kernel drops a dead holder's flock: no stale lock after a crash.
    sf = StateFile(path)
    sf.acquire()
    sf.release()


def test_write_is_atomic_replace(tmp_path: Path) -> None:
    sf = StateFile(tmp_path / "cairnqd-x.json")
    sf.acquire()
    state = initial_state("c.yaml")
    sf.write(state)
    inode = os.stat(sf.path).st_ino
    sf.write(after_reload(state, ok=True, errors=[], generation=2))
    # A new inode: readers holding the old file see it whole, never half-written.
    assert os.stat(sf.path).st_ino != inode
    assert json.loads(Path(sf.path).read_text())["reload"]["seq"] == 1
    sf.release()


# -- a runtime directory another local user could reach ---------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
NOBODY = 65534


def test_a_symlink_planted_as_the_lock_file_is_refused_not_followed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    sf = StateFile(run / "cairnqd-x.json")
    os.symlink(victim, sf.lock_path)
    with pytest.raises(UnsafeRuntimeDir, match=r"cairnqd-x\.lock is a symlink: refusing"):
        sf.acquire()
    assert victim.read_text() == "precious\n"
    assert not sf.held


def test_a_directory_others_may_write_to_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o777)
    with pytest.raises(UnsafeRuntimeDir, match=r"writable by group or others \(mode 0777\)"):
        StateFile(run / "cairnqd-x.json").acquire()
    run.chmod(0o1730)  # group-writable, sticky: still not ours alone
    with pytest.raises(UnsafeRuntimeDir, match="mode 1730"):
        StateFile(run / "cairnqd-x.json").acquire()


@needs_root
def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    os.chown(run, NOBODY, NOBODY)
    with pytest.raises(UnsafeRuntimeDir, match=f"belongs to uid {NOBODY}, not to this process"):
        StateFile(run / "cairnqd-x.json").acquire()
    # In place of the directory, another user's symlink to one of ours.
    (tmp_path / "mine").mkdir(mode=0o700)
    link = tmp_path / "link"
    os.symlink(tmp_path / "mine", link)
    os.lchown(link, NOBODY, NOBODY)
    with pytest.raises(UnsafeRuntimeDir, match=f"is a symlink owned by uid {NOBODY}"):
        StateFile(link / "cairnqd-x.json").acquire()


def test_the_client_refuses_a_symlinked_state_file(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps(initial_state("c.yaml")))
    sf = StateFile(run / "cairnqd-x.json")
    os.symlink(planted, sf.path)
    with pytest.raises(StateFileError, match=r"cairnqd-x\.json is a symlink: refusing"):
        sf.read()


@needs_root
def test_the_client_refuses_a_state_file_of_another_owner(tmp_path: Path) -> None:
    sf = StateFile(tmp_path / "run" / "cairnqd-x.json")
    with sf:
        sf.write(initial_state("c.yaml"))
        assert sf.read() is not None and sf.owner == 0
        os.chown(sf.path, NOBODY, NOBODY)
        with pytest.raises(StateFileError, match=f"belongs to uid {NOBODY}, not to the directory"):
            sf.read()
