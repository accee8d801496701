"""An idle SQLite waiter sleeps until the kernel reports a write to the database's files
(store/sqlite/filewatch.py), instead of reading `pragma data_version` every 2 ms: real
files, real processes writing them, a real fork."""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cairnqd.store.sqlite import filewatch
from cairnqd.store.sqlite.filewatch import FileWatch
from cairnqd.store.sqlite.store import SQLiteStore

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's"),
]

# Another process submits one task to the database at argv[1].
SUBMIT = """
import asyncio, sys
import cairnqd

async def main():
    async with cairnqd.CairnQ.sqlite(sys.argv[1]) as client:
        await client.submit("other", queue="elsewhere")

asyncio.run(main())
"""


def append(path: Path, data: bytes = b"x") -> None:
    """One write(2) by another process, as a commit by another SDK would be."""
    code = "import sys; open(sys.argv[1], 'ab').write(sys.argv[2].encode())"
    subprocess.run([sys.executable, "-c", code, str(path), data.decode()], check=True)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "q.db")
    await s.connect()
    try:
        yield s
    finally:
        await s.close()


async def test_a_write_to_the_wal_ends_a_wait_and_other_files_do_not(tmp_path: Path) -> None:
    watch = FileWatch.open(str(tmp_path / "q.db"))
    assert watch is not None
    try:
        seen = watch.writes
        waiting = asyncio.ensure_future(watch.next_write(seen, 30.0))
        append(tmp_path / "q.db.log")  # a neighbour, not one of the database's files
        append(tmp_path / "other.db-wal")
        done, _ = await asyncio.wait({waiting}, timeout=0.5)
        assert not done, "a write to another file ended the wait"
        assert watch.writes == seen
        started = time.monotonic()
        append(tmp_path / "q.db-wal")
        await asyncio.wait_for(waiting, 10)
        assert watch.writes == seen + 1
        assert time.monotonic() - started < 5
    finally:
        watch.close()


async def test_a_write_before_the_wait_began_still_ends_it(tmp_path: Path) -> None:
    """The waiter reads `writes`, looks at the database, then waits: a commit in
    between is queued in the kernel and counts."""
    watch = FileWatch.open(str(tmp_path / "q.db"))
    assert watch is not None
    try:
        seen = watch.writes
        append(tmp_path / "q.db")
        await asyncio.wait_for(watch.next_write(seen, 30.0), 10)
        assert watch.writes == seen + 1
    finally:
        watch.close()


async def test_an_idle_wait_reads_the_database_only_when_woken(store: SQLiteStore) -> None:
    reads = 0
    version = store._data_version

    def counted() -> int:
        nonlocal reads
        reads += 1
        return version()

    store._data_version = counted  # type: ignore[method-assign]
    started = time.monotonic()
    await store.claim_wake(["default"], 1000)
    assert time.monotonic() - started >= 0.9, "the wait ended with nothing written"
    # Polling every 2 ms read it ~500 times; asleep on the watch, once or twice.
    assert reads <= 5, f"{reads} reads of data_version in one idle second"


async def test_a_commit_by_another_process_ends_the_wait_soon(
    store: SQLiteStore, tmp_path: Path
) -> None:
    """The commit's write is reported before the commit is published (the WAL index in
    shared memory): the waiter looks again until it shows, not at its timeout."""
    for _ in range(3):
        waiting = asyncio.ensure_future(store.claim_wake(["default"], 30_000))
        await asyncio.sleep(0)
        started = time.monotonic()
        await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", SUBMIT, str(tmp_path / "q.db")], check=True
        )
        await asyncio.wait_for(waiting, 10)
        # The submitting interpreter's start is most of this; the 30 s timeout is not.
        assert time.monotonic() - started < 10


async def test_a_commit_counted_before_the_wait_and_published_after_it_ends_the_wait(
    store: SQLiteStore, tmp_path: Path
) -> None:
    """The loop can read the kernel's report of a commit's write while it does other
    work, and the commit show in `data_version` only after the wait's first look: the
    wait must keep looking until it shows, not sleep until the next write (none came,
    so it slept to its timeout; a lone group child then started the task a poll late).
    The publish is held back by answering the old version for 50 ms: which of the two
    comes first on its own is up to the scheduler."""
    watch = store._file_watch()
    assert watch is not None
    before, counted = store._data_version(), watch.writes
    await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", SUBMIT, str(tmp_path / "q.db")], check=True
    )
    await watch.next_write(counted, 10)  # the commit's write, counted before the wait
    assert watch.writes > counted
    real = store._data_version
    published_at = time.monotonic() + 0.05
    store._data_version = lambda: before if time.monotonic() < published_at else real()  # type: ignore[method-assign]
    store._wake_baseline = (before, store._local_commits)  # as the claim before saw it
    started = time.monotonic()
    await store.claim_wake(["default"], 20_000)
    assert time.monotonic() - started < 5, "the wait slept past the commit it had seen"


async def test_without_the_kernel_s_help_a_waiter_polls(
    monkeypatch: pytest.MonkeyPatch, store: SQLiteStore, tmp_path: Path
) -> None:
    # Not Linux, or no inotify instance left: FileWatch.open has nothing to offer.
    monkeypatch.setattr(filewatch, "_libc", lambda: None)
    assert FileWatch.open(str(tmp_path / "q.db")) is None
    waiting = asyncio.ensure_future(store.claim_wake(["default"], 30_000))
    await asyncio.sleep(0)
    await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", SUBMIT, str(tmp_path / "q.db")], check=True
    )
    await asyncio.wait_for(waiting, 10)
    assert store._watch is None


def _report_fork_copy(watch: FileWatch, out: multiprocessing.connection.Connection) -> None:
    out.send((watch.mine, watch.usable))


def test_a_forked_child_never_reads_its_parent_s_watch(tmp_path: Path) -> None:
    watch = FileWatch.open(str(tmp_path / "q.db"))
    assert watch is not None
    try:
        assert watch.mine and watch.usable
        ctx = multiprocessing.get_context("fork")
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_report_fork_copy, args=(watch, send))
        child.start()
        try:
            assert receive.poll(30), "the child reported nothing"
            assert receive.recv() == (False, False)
        finally:
            child.join(30)
        assert child.exitcode == 0
    finally:
        watch.close()
