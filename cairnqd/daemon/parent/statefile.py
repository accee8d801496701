"""The daemon's state file: how `cairnqd reload` finds the daemon and learns the outcome.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NotRequired, TypedDict, cast

from cairnqd import __version__
from cairnqd.daemon.parent.runtimedir import UnsafeRuntimeDir, open_in, open_runtime_dir
from cairnqd.daemon.wire.messages import PROTOCOL_VERSION
from cairnqd.errors import CairnQError

__all__ = [
    "AlreadyRunning",
    "DaemonState",
    "ReloadState",
    "StateFile",
    "StateFileError",
    "UpgradeState",
    "after_reload",
    "after_upgrade",
    "initial_state",
    "master_title",
    "running_masters",
    "state_path",
    "state_path_of_running",
]


class ReloadState(TypedDict):
    #: Bumped by every reload attempt; 0 until the first one.
    seq: int
    ok: bool
    #: The reasons a refused reload gave, one `file:line:col: ...` line each.
    errors: list[str]
    #: Unix time of the attempt (or of the start, before any reload).
    at: float
    #: What an applied reload changed, one line each (none: nothing changed). Absent
    #: in a state file written before this field existed.
    changes: NotRequired[list[str]]


class DaemonState(TypedDict):
    pid: int
    generation: int
    #: Absolute path of the config file the daemon loaded.
    config: str
    reload: ReloadState
    #: The running code's release and pipe protocol, which `reload --all` compares with
    #: the installed code's. Absent in a state file of a release before 0.2.0.
    version: NotRequired[str]
    pipe_protocol: NotRequired[int]
    #: The last binary upgrade (`cairnqd upgrade`). Absent in a state file of a
    #: release that cannot upgrade in place: the CLI then says to restart.
    upgrade: NotRequired[UpgradeState]


class UpgradeState(TypedDict):
    #: Bumped by every upgrade attempt; 0 until the first one.
    seq: int
    ok: bool
    errors: list[str]
    at: float
    #: The release that ran before the upgrade (empty before the first one).
    from_version: str
    from_pid: int


class AlreadyRunning(CairnQError):
    """Another live process holds this config's lock (the CLI exits 75)."""

    def __init__(self, pid: int | None, lock_path: str) -> None:
        self.pid = pid
        self.lock_path = lock_path
        who = f"pid {pid}" if pid is not None else "another process"
        super().__init__(f"cairnqd is already running for this config ({who} holds {lock_path})")


class StateFileError(CairnQError):
    """The state file exists but does not hold a daemon state, or cannot be trusted."""


#: A state file is a few hundred bytes; reading stops well past that.
_MAX_STATE_CHARS = 1 << 20


def state_path(config_path: str | os.PathLike[str], runtime_dir: str) -> str:
    """Where the daemon for `config_path` keeps its state. The hash is of the absolute
    path, so `-c cairnq.yaml` and `-c /etc/cairnq/cairnq.yaml` agree from /etc/cairnq."""
    absolute = os.path.abspath(os.fspath(config_path))
    digest = hashlib.sha256(absolute.encode()).hexdigest()[:16]
    return os.path.join(runtime_dir, f"cairnqd-{digest}.json")


def master_title(config_path: str | os.PathLike[str]) -> str:
    """How the master for `config_path` titles itself (`ps`, /proc/PID/cmdline), before
    what it says about its generation and children."""
    return f"cairnqd: master [{os.path.abspath(os.fspath(config_path))}]"


def running_masters(
    config_path: str | os.PathLike[str], proc: str = "/proc"
) -> list[tuple[int, str]]:
    """The live masters for `config_path`, found from the processes rather than from
    the config file: (pid, state file path) for each process titled as that config's
    master that holds the config's lock file open. The state file sits beside the
    lock, in the runtime directory the daemon chose when it started. Only processes
    whose descriptors we may read are seen (our own; every one for root)."""
    title = master_title(config_path)
    lock_name = os.path.basename(state_path(config_path, "")).removesuffix(".json") + ".lock"
    found: list[tuple[int, str]] = []
    try:
        entries = os.listdir(proc)
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            raw = Path(proc, entry, "cmdline").read_bytes()
        except OSError:
            continue
        text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        if text != title and not text.startswith(title + " "):
            continue
        lock = _held_file(os.path.join(proc, entry, "fd"), lock_name)
        if lock is not None:
            found.append((int(entry), lock.removesuffix(".lock") + ".json"))
    return found


def _held_file(fd_dir: str, name: str) -> str | None:
    """The path of the file called `name` a process holds open, from its fd directory."""
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if os.path.isabs(target) and os.path.basename(target) == name:
            return target
    return None


def state_path_of_running(config_path: str | os.PathLike[str], runtime_dir: str) -> str:
    """The state file of the daemon running `config_path`: the one in `runtime_dir`
    when a daemon holds its lock, else the one a single running master for the config
    holds (its runtime directory, chosen at its start, may differ from what the file
    names now), else the one in `runtime_dir`."""
    named = StateFile(state_path(config_path, runtime_dir))
    if named.locked_by_other():
        return named.path
    masters = running_masters(config_path)
    if len(masters) == 1:
        return masters[0][1]
    return named.path


def initial_state(config_path: str | os.PathLike[str], generation: int = 1) -> DaemonState:
    """What a daemon writes once it holds the lock: this pid, no reload yet."""
    return {
        "pid": os.getpid(),
        "generation": generation,
        "config": os.path.abspath(os.fspath(config_path)),
        "reload": {"seq": 0, "ok": True, "errors": [], "at": time.time()},
        "version": __version__,
        "pipe_protocol": PROTOCOL_VERSION,
        "upgrade": {
            "seq": 0,
            "ok": True,
            "errors": [],
            "at": time.time(),
            "from_version": "",
            "from_pid": 0,
        },
    }


def after_upgrade(
    state: DaemonState, *, ok: bool, errors: Sequence[str], from_version: str, from_pid: int
) -> DaemonState:
    """The state after one upgrade attempt. A failed one keeps the running parent's
    pid and release; a successful one is written by the successor, with its own."""
    previous = state.get("upgrade")
    upgrade: UpgradeState = {
        "seq": (previous["seq"] if previous else 0) + 1,
        "ok": ok,
        "errors": list(errors),
        "at": time.time(),
        "from_version": from_version,
        "from_pid": from_pid,
    }
    if not ok:
        return {**state, "upgrade": upgrade}
    return {
        **state,
        "pid": os.getpid(),
        "version": __version__,
        "pipe_protocol": PROTOCOL_VERSION,
        "upgrade": upgrade,
    }


def after_reload(
    state: DaemonState,
    *,
    ok: bool,
    errors: list[str],
    generation: int,
    changes: Sequence[str] = (),
) -> DaemonState:
    """The state after one reload attempt: `seq` moves whether it applied or not."""
    reload: ReloadState = {
        "seq": state["reload"]["seq"] + 1,
        "ok": ok,
        "errors": list(errors),
        "at": time.time(),
        "changes": list(changes),
    }
    return {**state, "generation": generation, "reload": reload}


class StateFile:
    """The state file at `path` and its lock at `<path without .json>.lock`, both
    in a runtime directory that `runtimedir` accepts."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.directory = os.path.dirname(self.path) or "."
        self.name = os.path.basename(self.path)
        stem = self.path.removesuffix(".json")
        self.lock_path = stem + ".lock"
        self._lock_name = os.path.basename(self.lock_path)
        self._lock_fd: int | None = None
        self._dir_fd: int | None = None
        #: Whether this process is the one the state file describes: it writes the
        #: file and removes it on the way out. A binary upgrade moves this from the
        #: running parent to its successor while both hold the lock.
        self.owned = False
        #: The uid that owns the state file `read()` returned last.
        self.owner: int | None = None

    @property
    def held(self) -> bool:
        return self._lock_fd is not None

    @property
    def lock_fd(self) -> int | None:
        """The lock's descriptor, passed to a successor, which then shares the lock."""
        return self._lock_fd

    # -- the daemon's side ---------------------------------------------------------------

    def acquire(self) -> None:
        """Take the lock for this process's life. AlreadyRunning when another process
        holds it; UnsafeRuntimeDir when the directory or the lock file is not ours."""
        if self._lock_fd is not None:
            return
        dir_fd = open_runtime_dir(self.directory, create=True)
        assert dir_fd is not None  # created if missing
        try:
            # O_CLOEXEC (open_in's): a child must not inherit the lock, or the
            # daemon's lock would outlive it while a child lives on.
            fd = open_in(dir_fd, self.directory, self._lock_name, os.O_RDWR | os.O_CREAT)
        except BaseException:
            os.close(dir_fd)
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            os.close(dir_fd)
            raise AlreadyRunning(holder, self.lock_path) from None
        except BaseException:
            os.close(fd)
            os.close(dir_fd)
            raise
        self._lock_fd, self._dir_fd = fd, dir_fd
        self.promote()

    def adopt(self, lock_fd: int) -> None:
        """Take over a lock a running parent passed us (a binary upgrade): held
        already, since the descriptor shares its lock. StateFileError if `lock_fd` is
        not this file's lock; the state file stays the running parent's until
        `promote()`."""
        try:
            held, named = os.fstat(lock_fd), os.stat(self.lock_path)
        except OSError as exc:
            raise StateFileError(
                f"{self.lock_path}: cannot check the inherited lock: {exc}"
            ) from None
        if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
            raise StateFileError(f"the inherited descriptor {lock_fd} is not {self.lock_path}")
        dir_fd = open_runtime_dir(self.directory, create=False)
        if dir_fd is None:
            raise StateFileError(f"runtime directory {self.directory} is gone")
        os.set_inheritable(lock_fd, False)
        self._lock_fd, self._dir_fd = lock_fd, dir_fd

    def promote(self) -> None:
        """This process is the daemon the state file describes from now on. The pid
        in the lock file names it even before the first write()."""
        assert self._lock_fd is not None
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"{os.getpid()}\n".encode(), 0)
        self.owned = True

    def hand_over(self) -> None:
        """Let a successor that shares the lock own the state: our descriptors close,
        the files stay (the lock lives on in the successor's descriptor)."""
        self.owned = False
        for fd in (self._dir_fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._lock_fd = self._dir_fd = None

    def lost(self) -> str | None:
        """What of ours is gone from the runtime directory (logind removes
        $XDG_RUNTIME_DIR at its user's last logout; a /tmp cleaner removes old files):
        "lock" when the lock's path no longer names the file we hold locked, "state"
        when only the state file is missing; None when both are in place, or when we
        do not own them (a successor not yet serving, a parent that handed over)."""
        if not self.owned or self._lock_fd is None:
            return None
        try:
            named = os.stat(self.lock_path, follow_symlinks=False)
        except FileNotFoundError:
            return "lock"
        except OSError:
            return None  # cannot tell (a hung mount, say): the next look decides
        held = os.fstat(self._lock_fd)
        if (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
            return "lock"
        return None if os.path.lexists(self.path) else "state"

    def restore(self) -> None:
        """Take the lock again at its path, in a runtime directory made anew if it was
        removed, after `lost()` said "lock": the old lock guards an inode no other
        daemon can find, so a second daemon would start on our config. AlreadyRunning
        when one already has; UnsafeRuntimeDir or OSError when the directory cannot be
        made. On any failure the old descriptors are kept, to try again later."""
        old = (self._lock_fd, self._dir_fd)
        self._lock_fd = self._dir_fd = None
        try:
            self.acquire()
        except BaseException:
            self._lock_fd, self._dir_fd = old
            raise
        for fd in old:
            if fd is not None:
                os.close(fd)

    def write(self, state: DaemonState) -> None:
        """Replace the state atomically: readers see the old file or the new one."""
        dir_fd = self._dir_fd
        if dir_fd is None or not self.owned:
            raise StateFileError(f"{self.path}: write() needs the lock (acquire() first)")
        temp = f".cairnqd-{secrets.token_hex(8)}.tmp"
        fd = open_in(dir_fd, self.directory, temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(state, f, indent=2, sort_keys=True)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, self.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=dir_fd)
            raise

    def release(self) -> None:
        """Remove the state (no daemon any more) and drop the lock; the lock file stays.
        A successor that never took over leaves the running parent's state alone."""
        if self._lock_fd is None:
            return
        if self._dir_fd is not None and self.owned:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.name, dir_fd=self._dir_fd)
        if self._dir_fd is not None:
            os.close(self._dir_fd)
        os.close(self._lock_fd)
        self._lock_fd = self._dir_fd = None
        self.owned = False

    def __enter__(self) -> StateFile:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    # -- the client's side ---------------------------------------------------------------

    def read(self) -> DaemonState | None:
        """The current state; None when there is no file. StateFileError if it is not
        a daemon state (written by something else, or truncated by a full disk), or
        UnsafeRuntimeDir (a StateFileError too) if it is not one we may trust."""
        try:
            text = self._read_text()
        except UnsafeRuntimeDir as exc:
            raise StateFileError(str(exc)) from None
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateFileError(f"{self.path}: cannot read: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StateFileError(
                f"{self.path}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from None
        return _validate(self.path, data)

    def _read_text(self) -> str:
        dir_fd = open_runtime_dir(self.directory, create=False)
        if dir_fd is None:
            raise FileNotFoundError(self.directory)
        try:
            fd = open_in(dir_fd, self.directory, self.name, os.O_RDONLY)
            self.owner = os.fstat(fd).st_uid
        finally:
            os.close(dir_fd)
        with os.fdopen(fd, encoding="utf-8") as f:
            return f.read(_MAX_STATE_CHARS)

    def locked_by_other(self) -> bool:
        """Whether some process holds the lock: a daemon is alive for this config,
        whatever the JSON says. Probes with a non-blocking shared lock, released at once."""
        try:
            fd = os.open(self.lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        except OSError:
            return False  # a symlink in its place: no daemon of ours holds that
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops the probe's lock too
        return False


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


_FIELDS: dict[str, type | tuple[type, ...]] = {
    "pid": int,
    "generation": int,
    "config": str,
    "reload": dict,
}
_RELOAD_FIELDS: dict[str, type | tuple[type, ...]] = {
    "seq": int,
    "ok": bool,
    "errors": list,
    "at": (int, float),
}


def _has(value: Any, kinds: type | tuple[type, ...]) -> bool:
    # bool is an int subclass, but a pid or seq of `true` is still garbage.
    if isinstance(value, bool):
        return kinds is bool
    return isinstance(value, kinds)


def _validate(path: str, data: Any) -> DaemonState:
    def wrong(field: str) -> StateFileError:
        return StateFileError(f"{path}: not a cairnqd state file: bad or missing {field!r}")

    if not isinstance(data, dict):
        raise StateFileError(f"{path}: not a cairnqd state file: expected a JSON object")
    for field, kinds in _FIELDS.items():
        if not _has(data.get(field), kinds):
            raise wrong(field)
    reload = data["reload"]
    for field, kinds in _RELOAD_FIELDS.items():
        if not _has(reload.get(field), kinds):
            raise wrong(f"reload.{field}")
    if not all(isinstance(e, str) for e in reload["errors"]):
        raise wrong("reload.errors")
    changes = reload.get("changes", [])
    if not isinstance(changes, list) or not all(isinstance(c, str) for c in changes):
        raise wrong("reload.changes")
    upgrade = data.get("upgrade", {"seq": 0, "ok": True, "errors": [], "at": 0.0})
    if not isinstance(upgrade, dict):
        raise wrong("upgrade")
    for field, kinds in _RELOAD_FIELDS.items():
        if not _has(upgrade.get(field), kinds):
            raise wrong(f"upgrade.{field}")
    if not all(isinstance(e, str) for e in upgrade["errors"]):
        raise wrong("upgrade.errors")
    return cast(DaemonState, data)  # the shape was checked above
