"""The search box's store read on SQLite and Postgres: a key or name prefix or payload
text among the newest tasks, and a cost that follows the window, not the table."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from cairnqd._protocol import statement
from cairnqd.models import Task
from cairnqd.store.base import TaskStore, wall_clock_ms
from cairnqd.store.sqlite import SQLiteStore
from cairnqd.store.sqlite import statements as sqlite_statements


@pytest.fixture
def seeded(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """5,000 tasks and the indexes a serving dashboard builds."""
    path = str(tmp_path / "search.db")

    async def create() -> None:
        store = SQLiteStore(path)
        await store.connect()
        await store.ensure_schema("dashboard_indexes")
        await store.close()

    asyncio.run(create())
    rows = [(f"task_{i:026d}", f"name.{i % 7}", 1_000_000 + i) for i in range(5000)]
    with closing(sqlite3.connect(path)) as conn:
        conn.executemany(
            """insert into cairnq_tasks (id, name, queue, status, payload, metadata,
                   run_at_ms, created_at_ms, updated_at_ms)
               values (?, ?, 'q', 'queued', '{"a": 1}', '{}', 0, ?, 0)""",
            rows,
        )
        conn.commit()
        conn.execute("analyze")
    conn = sqlite3.connect(path)
    try:
        yield conn
    finally:
        conn.close()


async def test_search_by_key_name_or_payload_among_the_newest(store: TaskStore) -> None:
    old = await store.submit(name="billing.sync", queue="a", key="order-17", payload={"n": 0})
    made = []
    for i in range(4):
        payload = {"customer": f"ACME corp {i}", "n": i}
        made.append(await store.submit(name=f"mail.send.{i}", queue="a", payload=payload))
    keyed = await store.submit(name="x", queue="a", key="order-18", payload={})

    def newest_first(tasks: list[Task]) -> list[str]:
        # By creation time, then id: submits within one millisecond get ULIDs in
        # random order, so the submit order is not the page's.
        return [t.id for t in sorted(tasks, key=lambda t: (t.created_at_ms, t.id), reverse=True)]

    found = await store.dashboard.search("order-", scan=100, limit=10)
    assert [h.task.id for h in found.hits] == newest_first([keyed, old])
    assert {h.task.id: h.key for h in found.hits} == {keyed.id: "order-18", old.id: "order-17"}
    assert not found.cut and found.scanned == 100
    by_name = await store.dashboard.search("mail.send", scan=100, limit=10)
    assert [h.task.id for h in by_name.hits] == newest_first(made)
    by_text = await store.dashboard.search("acme CORP 2", scan=100, limit=10)
    assert [h.task.id for h in by_text.hits] == [made[2].id]
    assert len((await store.dashboard.search("mail.", scan=100, limit=2)).hits) == 2

    # Three newest only: the old task is out of reach but for its whole key.
    cut = await store.dashboard.search("billing", scan=3, limit=10)
    assert cut.hits == [] and cut.cut
    whole = await store.dashboard.search("order-17", scan=3, limit=10)
    assert [(h.task.id, h.key) for h in whole.hits] == [(old.id, "order-17")] and whole.cut
    with pytest.raises(ValueError, match="scan"):
        await store.dashboard.search("x", scan=0, limit=10)
    with pytest.raises(ValueError, match="text"):
        await store.dashboard.search(3, scan=10, limit=10)  # type: ignore[arg-type]


def _search_steps(conn: sqlite3.Connection, scan: int) -> int:
    params = {"text": "no such text", "scan": scan, "limit": 100}
    stmt = statement("sqlite", "extensions/dashboard_search")
    bound = sqlite_statements.bind(stmt, params, wall_clock_ms)
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    conn.set_progress_handler(tick, 100)
    try:
        assert conn.execute(stmt.text, bound).fetchall() == []
    finally:
        conn.set_progress_handler(None, 0)
    return count[0]


def test_sqlite_search_reads_the_newest_tasks_only(seeded: sqlite3.Connection) -> None:
    """The search's cost follows `scan`, not the table: the newest rows are read from
    the creation index in order, never the whole table sorted."""
    stmt = statement("sqlite", "extensions/dashboard_search")
    bound = sqlite_statements.bind(stmt, {"text": "x", "scan": 100, "limit": 10}, wall_clock_ms)
    plan = "\n".join(r[3] for r in seeded.execute("explain query plan " + stmt.text, bound))
    assert "cairnqd_tasks_created_idx" in plan, plan
    small, whole = _search_steps(seeded, 100), _search_steps(seeded, 5000)
    assert small * 10 < whole, (small, whole)
