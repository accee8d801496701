"""SQLite's pipelined `submit_many` (store/sqlite/bulk.py): the helper thread inserts a
step while the loop checks the next. What it must keep: all or nothing when the database
refuses a row on the thread, or when the call is cancelled halfway, and a store that
works afterwards. (Order, fields, keys and bad items: tests/store/test_submit_many.py,
which runs its long lists through this path too.)"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cairnqd.store.sqlite import SQLiteStore
from cairnqd.store.sqlite.bulk import PIPELINE_FROM, STEP, steps


@pytest.fixture
async def lite(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "tasks.db")
    async with store:
        yield store


def _count(path: str, name: str) -> int:
    with sqlite3.connect(path) as conn:
        (n,) = conn.execute("select count(*) from cairnq_tasks where name = ?", (name,)).fetchone()
    conn.close()
    return int(n)


def _items(n: int, name: str = "bulk") -> list[dict[str, object]]:
    return [{"name": name, "payload": {"i": i}} for i in range(n)]


async def test_a_row_refused_on_the_helper_thread_rolls_back_the_whole_list(
    lite: SQLiteStore,
) -> None:
    with sqlite3.connect(lite.path) as conn:
        conn.execute(
            "create trigger test_refuse before insert on cairnq_tasks"
            " when new.name = 'poison' begin select raise(abort, 'poison refused'); end"
        )
    conn.close()
    items = _items(1000)
    items[700] = {"name": "poison"}  # in the third step, after two went in
    with pytest.raises(sqlite3.IntegrityError, match="poison refused"):
        await lite.submit_many(items)
    assert _count(lite.path, "bulk") == 0
    # The transaction and the in-process lock were released: the store goes on.
    items[700] = {"name": "bulk", "payload": {"i": 700}}
    tasks = await lite.submit_many(items)
    assert [t.payload for t in tasks] == [{"i": i} for i in range(1000)]
    assert _count(lite.path, "bulk") == 1000


async def test_a_call_cancelled_halfway_writes_nothing_and_the_store_goes_on(
    lite: SQLiteStore,
) -> None:
    call = asyncio.create_task(lite.submit_many(_items(60_000)))
    # Wait until rows are going in on the thread (the write lock is taken, steps run).
    while not (lite._scan_thread is not None and lite._lock.locked()):  # noqa: ASYNC110 - no event for it
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.05)
    assert not call.done(), "the list went in before it could be cancelled: make it longer"
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert _count(lite.path, "bulk") == 0
    tasks = await lite.submit_many(_items(PIPELINE_FROM + 1, "after"))
    assert len(tasks) == PIPELINE_FROM + 1
    assert _count(lite.path, "after") == PIPELINE_FROM + 1


@given(st.integers(0, 5000), st.integers(0, 5000))
def test_steps_cover_the_span_in_single_statements(start: int, length: int) -> None:
    spans = steps(start, start + length)
    # Contiguous, in order, covering [start, start + length) exactly.
    starts, ends = [a for a, _ in spans], [b for _, b in spans]
    assert starts == [start, *ends[:-1]][: len(spans)]
    assert (ends[-1] if spans else start) == start + length
    for a, b in spans:
        size = b - a
        assert 0 < size <= STEP and size & (size - 1) == 0  # one statement of run_rows
