"""A real filesystem that fills up: a small tmpfs mounted for one test.

`small_disk` mounts a tmpfs of a few MiB under the test's temporary directory. The test
puts its SQLite file there, fills what is left with a filler file until the kernel says
ENOSPC, and deletes the filler to give the room back. Every write SQLite then attempts
fails as it would on a full production disk (SQLITE_FULL, "database or disk is full").

Mounting needs CAP_SYS_ADMIN: without it the test is skipped, except in CI, which
runs as root and must not pass by skipping.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.netns import CAP_SYS_ADMIN, has_capabilities
from tests.support.databases import REQUIRE_PG

_CHUNK = b"\0" * (64 * 1024)


class SmallDisk:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._filler = path / "filler"

    def fill(self, database: Path) -> None:
        """Leave no free block. The database's WAL is checkpointed and truncated first:
        a WAL keeps its length after a checkpoint and SQLite reuses it from the start,
        so writes that fit in it would not need the disk at all."""
        conn = sqlite3.connect(database, timeout=10)
        try:
            conn.execute("pragma wal_checkpoint(truncate)")
        finally:
            conn.close()
        try:
            # Unbuffered: a buffer left unwritten at ENOSPC would fail again on close.
            out = open(self._filler, "ab", buffering=0)  # noqa: SIM115 (closed below)
        except OSError as exc:
            # The database's own writes filled the disk first (a daemon's WAL and its
            # attempt records grow while it runs): full is what was wanted.
            if exc.errno != errno.ENOSPC:
                raise
            return
        with out:
            try:
                while True:
                    out.write(_CHUNK)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        # Smaller writes may still fit in the last partial chunk: take those bytes too.
        fd = os.open(self._filler, os.O_WRONLY | os.O_APPEND)
        try:
            while True:
                os.write(fd, b"\0")
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        finally:
            os.close(fd)

    def leave(self, nbytes: int) -> None:
        """After `fill`: give `nbytes` back, room for a few small writes (a claim's
        pages in the WAL) but not for a large one (a big result)."""
        size = self._filler.stat().st_size
        os.truncate(self._filler, max(0, size - nbytes))

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)


def _skip_or_fail(message: str) -> None:
    if REQUIRE_PG:  # CI: root, and every fault test must run
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A fresh 8 MiB tmpfs at `tmp_path / "disk"`, unmounted after the test."""
    if not has_capabilities(CAP_SYS_ADMIN):
        _skip_or_fail("mounting a tmpfs needs CAP_SYS_ADMIN (run as root)")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        _skip_or_fail(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield SmallDisk(mount_point)
    finally:
        # Lazy: a connection a failed test left open must not keep the mount alive.
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)
