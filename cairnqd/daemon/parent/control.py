"""The control socket: how `cairnqd status` and `cairnqd top` ask a running daemon
about itself.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from cairnqd.daemon.parent.runtimedir import UnsafeRuntimeDir, open_runtime_dir

if TYPE_CHECKING:
    # Types only: the CLI imports this module for its client, and must not pay for the
    # daemon's pool (and everything it imports) on every command.
    from cairnqd.daemon.parent.pool import ChildProcess, GroupPool

log = logging.getLogger("cairnqd.supervisor")

#: The snapshot is rebuilt at most this often; a tick that finds it fresher than this
#: leaves it, and the loop ticks again once it may be rebuilt (`next_publish`).
PUBLISH_EVERY_S = 0.25
_CLIENT_TIMEOUT_S = 2.0
_REQUEST_MAX = 256
_PEERCRED = struct.Struct("3i")  # pid, uid, gid

Snapshot = dict[str, Any]


def control_path(state_path: str) -> str:
    """The socket beside the daemon's state file (`cairnqd-<hash>.sock`)."""
    return state_path.removesuffix(".json") + ".sock"


def _peer_uid(conn: socket.socket) -> int:
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    return int(_PEERCRED.unpack(raw)[1])


def _via_fd(dir_fd: int, name: str) -> str:
    # A socket cannot be bound or connected relative to a directory descriptor;
    # /proc/self/fd/N names the very directory we checked, whatever its path now is.
    return f"/proc/self/fd/{dir_fd}/{name}"


class ControlServer:
    """The daemon's side: `start()` once the state file's lock is held, `publish()`
    from the loop, `stop()` on the way out."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.directory = os.path.dirname(path) or "."
        self.name = os.path.basename(path)
        self._snapshot: Snapshot = {}
        self._published_at = float("-inf")
        #: A tick came too soon after the last publish to rebuild the snapshot.
        self._owed = False
        self._sock: socket.socket | None = None
        self._dir_fd: int | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        #: The inode of the socket file we bound, so that stop() removes only ours.
        self._inode: int | None = None
        #: Requests answered; tests read it.
        self.answered = 0

    def start(self) -> None:
        """Bind the socket and start answering. OSError or UnsafeRuntimeDir when the
        socket cannot be made; the daemon runs on without it (status then says the
        daemon cannot be asked)."""
        dir_fd = open_runtime_dir(self.directory, create=True)
        assert dir_fd is not None
        # A start after a stop (the socket bound again once an upgrade failed at the
        # handover, or once the runtime directory was put back) must serve again.
        self._stopping.clear()
        try:
            self._remove_stale(dir_fd)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            old_umask = os.umask(0o177)
            try:
                sock.bind(_via_fd(dir_fd, self.name))
            finally:
                os.umask(old_umask)
            sock.listen(8)
            sock.settimeout(0.5)  # how often the thread looks at `_stopping`
            self._inode = os.lstat(self.name, dir_fd=dir_fd).st_ino
        except BaseException:
            os.close(dir_fd)
            raise
        self._sock, self._dir_fd = sock, dir_fd
        self._thread = threading.Thread(target=self._serve, name="cairnqd-control", daemon=True)
        self._thread.start()

    def _remove_stale(self, dir_fd: int) -> None:
        """A socket a crashed daemon left (we hold the lock, so it is no live one's)."""
        try:
            info = os.lstat(self.name, dir_fd=dir_fd)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.geteuid():
            raise UnsafeRuntimeDir(f"{self.path} exists and is not our socket: refusing it")
        os.unlink(self.name, dir_fd=dir_fd)

    def current(self) -> Snapshot | None:
        """The last snapshot published (from any thread), None before the first."""
        return self._snapshot or None

    def publish_due(self, build: Callable[[], Snapshot]) -> None:
        """Replace the snapshot with `build()` unless the last one is fresh enough."""
        if self._sock is None:
            return
        now = time.monotonic()
        if now - self._published_at < PUBLISH_EVERY_S:
            self._owed = True
            return
        self._published_at = now
        self._owed = False
        self._snapshot = build()

    def next_publish(self) -> float | None:
        """When a snapshot a tick left stale (`publish_due`) may be rebuilt; None when
        the last tick published."""
        if self._sock is None or not self._owed:
            return None
        return self._published_at + PUBLISH_EVERY_S

    def stop(self) -> None:
        self._stopping.set()
        if self._sock is not None:
            # Wakes the thread's accept() now rather than at its next timeout: a binary
            # upgrade's handover waits for this on the supervisor's loop.
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
        if self._dir_fd is not None:
            # Only the socket we bound: after a binary upgrade the path is a successor's.
            with contextlib.suppress(FileNotFoundError):
                if os.lstat(self.name, dir_fd=self._dir_fd).st_ino == self._inode:
                    os.unlink(self.name, dir_fd=self._dir_fd)
            os.close(self._dir_fd)
        self._sock = self._dir_fd = self._thread = None

    def _serve(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self._stopping.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stopping.is_set():
                    return
                log.warning("control socket: accept failed: %s", exc)
                time.sleep(0.5)
                continue
            with conn:
                try:
                    self._answer(conn)
                except (OSError, ValueError) as exc:
                    log.debug("control socket: a client went wrong: %s", exc)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(_CLIENT_TIMEOUT_S)
        uid = _peer_uid(conn)
        if uid not in (os.geteuid(), 0):
            conn.sendall(b'{"error": "not allowed"}\n')
            return
        request = b""
        while b"\n" not in request and len(request) < _REQUEST_MAX:
            chunk = conn.recv(_REQUEST_MAX)
            if not chunk:
                break
            request += chunk
        command = request.split(b"\n", 1)[0].strip().decode(errors="replace")
        if command == "status":
            reply: Mapping[str, Any] = self._snapshot
        else:
            reply = {"error": f"unknown request {command[:40]!r}; known: status"}
        conn.sendall(json.dumps(reply, separators=(",", ":")).encode() + b"\n")
        self.answered += 1


class DaemonUnreachable(Exception):
    """No daemon answers on the control socket; the message says why."""


def ask_daemon(path: str, request: str = "status", timeout_s: float = 5.0) -> Snapshot:
    """The client's side: send `request` to the daemon whose socket is `path`."""
    directory, name = os.path.dirname(path) or ".", os.path.basename(path)
    try:
        dir_fd = open_runtime_dir(directory, create=False)
    except UnsafeRuntimeDir as exc:
        raise DaemonUnreachable(str(exc)) from None
    if dir_fd is None:
        raise DaemonUnreachable(f"no runtime directory {directory}")
    try:
        return _ask(dir_fd, path, name, request, timeout_s)
    finally:
        os.close(dir_fd)


def _ask(dir_fd: int, path: str, name: str, request: str, timeout_s: float) -> Snapshot:
    try:
        info = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        raise DaemonUnreachable(f"no control socket at {path}") from None
    owner = os.fstat(dir_fd).st_uid
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != owner:
        raise DaemonUnreachable(f"{path} is not a socket of the directory's owner: not using it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(_via_fd(dir_fd, name))
            if _peer_uid(sock) != owner:
                raise DaemonUnreachable(f"the process behind {path} is not the directory's owner")
            sock.sendall(request.encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except (ConnectionRefusedError, FileNotFoundError):
            raise DaemonUnreachable(f"nothing listens on {path} (a stale socket?)") from None
        except TimeoutError:
            raise DaemonUnreachable(f"no answer on {path} within {timeout_s:g}s") from None
        except OSError as exc:
            raise DaemonUnreachable(f"cannot ask the daemon at {path}: {exc.strerror}") from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise DaemonUnreachable(f"the daemon at {path} sent no valid answer") from None
    if not isinstance(reply, dict):
        raise DaemonUnreachable(f"the daemon at {path} sent no valid answer")
    if "error" in reply:
        raise DaemonUnreachable(f"the daemon at {path} refused: {reply['error']}")
    return reply


# -- what the snapshot says -------------------------------------------------------------------


def child_view(child: ChildProcess, role: str, now: float) -> dict[str, Any]:
    """One child as status shows it; ages are brought forward to `now` from the
    heartbeat they came with."""
    longest = child.longest
    since_heard = max(0.0, now - child.last_heard)
    return {
        "pid": child.pid,
        "slot": child.slot,
        "role": role,
        "generation": child.generation,
        "state": child.state,
        "worker_id": child.worker_id,
        "uptime_s": round(now - child.spawned_at, 1),
        "rss": child.rss,
        "executing": child.executing,
        "held": child.held,
        "lag_s": child.lag_s,
        "longest": None
        if longest is None
        else {
            "id": longest.id,
            "name": longest.name,
            "age_s": round(longest.age_s + since_heard, 1),
        },
        "paused": list(child.paused),
        "room": child.room,
        "empty_wakes": child.empty_wakes,
        "running": [
            {"id": t.id, "name": t.name, "age_s": round(t.age_s + since_heard, 1)}
            for t in child.running
        ],
    }


def group_view(
    pool: GroupPool, restarts: int, now: float, shutdown_timeout_s: float = 0.0
) -> dict[str, Any]:
    """One group as status shows it; `shutdown_timeout_s` is the daemon-wide one, which
    the group's own replaces."""
    own = pool.config.shutdown_timeout
    if own is not None:
        shutdown_timeout_s = own.total_seconds()
    children: list[dict[str, Any]] = []
    for slot in pool.slots:
        if slot.child is not None:
            children.append(child_view(slot.child, "slot", now))
        if slot.successor is not None:
            children.append(child_view(slot.successor, "successor", now))
    children += [child_view(c, "retired", now) for c in pool.retired]
    ready = sum(1 for s in pool.slots if s.child is not None and s.child.state == "ready")
    return {
        "name": pool.name,
        "state": pool.state,
        "fatal_error": pool.fatal_error,
        "processes": len(pool.slots),
        "ready": ready,
        "restarts": restarts,
        "queues": list(pool.config.queues),
        "concurrency": pool.config.concurrency,
        # What `reload --wait` compares with the edited config to tell which groups
        # roll, and how long a roll lets their tasks finish.
        "fingerprint": pool.fingerprint,
        "shutdown_timeout_s": shutdown_timeout_s,
        "children": children,
    }


def restarts_by_group(samples: Iterable[Any]) -> dict[str, int]:
    """Children replaced per group, from the restart counter's samples."""
    totals: dict[str, int] = {}
    for metric in samples:
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                group = sample.labels.get("group", "")
                totals[group] = totals.get(group, 0) + int(sample.value)
    return totals


def daemon_view(
    *,
    instance: str,
    config_path: str,
    generation: int,
    started_at: float,
    stopping: bool,
    quiet: bool,
    groups: Iterable[GroupPool],
    removed: Iterable[GroupPool],
    restarts: Mapping[str, int],
    shutdown_timeout_s: float = 0.0,
) -> Snapshot:
    now = time.monotonic()
    return {
        "pid": os.getpid(),
        "instance": instance,
        "config": config_path,
        "generation": generation,
        "uptime_s": round(time.time() - started_at, 1),
        "stopping": stopping,
        "quiet": quiet,
        "groups": [group_view(g, restarts.get(g.name, 0), now, shutdown_timeout_s) for g in groups],
        "removed_groups": [
            group_view(g, restarts.get(g.name, 0), now, shutdown_timeout_s) for g in removed
        ],
    }
