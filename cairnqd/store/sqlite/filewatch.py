"""Wake-ups from the kernel when a database file is written (Linux inotify).

An idle SQLite worker must notice another process's commit within milliseconds. Reading
`pragma data_version` answers "did anyone commit?" cheaply, but asking it every 2 ms
costs an idle process ~3% of a core in wake-ups alone. Every commit writes the file
(the WAL in WAL mode, the database itself otherwise) through write(2), and the kernel
reports such writes to an inotify watch on the file's directory, whichever process
made them and on whatever filesystem (all the processes of a WAL database share one
kernel: its shared-memory index requires it). So a waiter sleeps until the kernel says
one of the database's files changed, then asks `data_version` whether that was a
commit by someone else.

`FileWatch.open` returns None where inotify is missing (not Linux, or the watch limit
reached): the caller then polls as before. The watch is tied to the process that made
it: a forked child never uses its parent's (`usable`).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import logging
import os
import struct
import sys
import time
from pathlib import Path

log = logging.getLogger("cairnqd.store.sqlite")

_IN_MODIFY = 0x00000002
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
# struct inotify_event: wd, mask, cookie, len, then `len` bytes of NUL-padded name.
_HEADER = struct.Struct("iIII")
_READ_SIZE = 64 * 1024


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.inotify_init1, libc.inotify_add_watch  # noqa: B018 - both must exist
    except (OSError, AttributeError):
        return None
    return libc


class FileWatch:
    """Counts writes to a few files of one directory, and wakes coroutines waiting for
    the next one. One watch serves every waiter of a store (one event loop)."""

    def __init__(self, fd: int, names: frozenset[bytes]) -> None:
        self._fd = fd
        self._names = names
        self._pid = os.getpid()
        self._waiters: set[asyncio.Future[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Writes seen so far (an overflow of the kernel's queue counts as one).
        self.writes = 0
        #: When the last of them was seen (monotonic clock; 0.0 before any).
        self.last_write_at = 0.0
        #: False once the directory's watch is gone (it was removed or unmounted).
        self.alive = True

    @classmethod
    def open(cls, path: str) -> FileWatch | None:
        """A watch on the database at `path` and its `-wal` and `-journal` files; None
        where the kernel offers none."""
        libc = _libc()
        if libc is None:
            return None
        target = Path(path).absolute()
        fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
        if fd < 0:
            log.debug("no inotify (%s): polling the database for commits", _errno_text())
            return None
        wd = int(libc.inotify_add_watch(fd, os.fsencode(target.parent), _IN_MODIFY))
        if wd < 0:
            log.info(
                "cannot watch %s for writes (%s): polling the database for commits",
                target.parent,
                _errno_text(),
            )
            os.close(fd)
            return None
        base = os.fsencode(target.name)
        return cls(fd, frozenset({base, base + b"-wal", base + b"-journal"}))

    @property
    def mine(self) -> bool:
        """Made by this process: a forked child's copy is not its own to read."""
        return self._pid == os.getpid()

    @property
    def usable(self) -> bool:
        return self._fd >= 0 and self.alive and self.mine

    async def next_write(self, after: int, timeout_s: float) -> None:
        """Return once `writes` passes `after`, or after `timeout_s`. Writes made
        before this call but not yet read from the kernel count: a waiter reads
        `writes`, checks the database, then waits, and loses nothing in between."""
        if self.writes != after or timeout_s <= 0:
            return
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._waiters:  # a second event loop: not ours to serve
                await asyncio.sleep(min(timeout_s, 0.002))
                return
            self._loop = loop
        waiter = loop.create_future()
        if not self._waiters:
            loop.add_reader(self._fd, self._read)
        self._waiters.add(waiter)
        try:
            await asyncio.wait({waiter}, timeout=timeout_s)
        finally:
            self._waiters.discard(waiter)
            if not self._waiters and self._fd >= 0:
                loop.remove_reader(self._fd)

    def _read(self) -> None:
        """The descriptor is readable: take every queued event, count the writes to
        our files, and wake the waiters if there were any."""
        seen = False
        while True:
            try:
                chunk = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                break
            except OSError as exc:
                log.warning("file watch failed (%s): polling the database for commits", exc)
                self.alive = False
                seen = True
                break
            if not chunk:
                break
            seen = self._scan(chunk) or seen
        if seen:
            self.writes += 1
            self.last_write_at = time.monotonic()
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _scan(self, chunk: bytes) -> bool:
        ours = False
        offset = 0
        while offset + _HEADER.size <= len(chunk):
            _wd, mask, _cookie, length = _HEADER.unpack_from(chunk, offset)
            start = offset + _HEADER.size
            name = chunk[start : start + length].rstrip(b"\0")
            offset = start + length
            if mask & _IN_IGNORED:
                self.alive = False  # the directory went away: nothing more will come
                ours = True
            elif mask & _IN_Q_OVERFLOW or name in self._names:
                ours = True
        return ours

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        # A forked copy's loop is its parent's, whose selector it shares: leave it be.
        if self._waiters and self._loop is not None and self.mine and not self._loop.is_closed():
            self._loop.remove_reader(fd)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        os.close(fd)


def _errno_text() -> str:
    code = ctypes.get_errno()
    return f"{errno.errorcode.get(code, code)}: {os.strerror(code)}"
