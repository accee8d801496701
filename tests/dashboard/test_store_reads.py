"""The store reads behind the dashboard's pages, on SQLite and Postgres, and the plans
SQLite picks for the task list (each sort must read an index in order, never sort)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing

import pytest

from cairnqd._protocol import statement
from cairnqd.errors import ErrorEnvelope
from cairnqd.store.base import TaskStore, wall_clock_ms
from cairnqd.store.browse import TaskQuery, TaskSummary
from cairnqd.store.sqlite import SQLiteStore
from cairnqd.store.sqlite import statements as sqlite_statements


async def _page_all(store: TaskStore, query: TaskQuery) -> list[TaskSummary]:
    seen: list[TaskSummary] = []
    cursor = None
    while True:
        from dataclasses import replace

        page = await store.dashboard.browse(replace(query, cursor=cursor))
        seen += page
        if len(page) < query.limit:
            return seen
        last = page[-1]
        value = last.sort_value(query.sort)
        assert value is not None
        cursor = (value, last.id)


async def _fail(store: TaskStore, queue: str, error_type: str) -> str:
    task = await store.submit(name="boom", queue=queue, max_attempts=1)
    (claimed,) = await store.claim(queues=[queue], worker_id="w1")
    assert claimed.id == task.id
    envelope = ErrorEnvelope(type=error_type, code="x", message=f"<{error_type}>")
    await store.fail(task_id=task.id, worker_id="w1", error=envelope, retryable=False)
    return task.id


async def test_keyset_pages_cover_every_row_once_in_order(store: TaskStore) -> None:
    # One transaction: on Postgres every row gets the same created_at_ms, so only the id
    # orders them; the cursor must break the ties.
    made = await store.submit_many([{"name": "n", "queue": "q"} for _ in range(23)])
    made += await store.submit_many([{"name": "m", "queue": "r"} for _ in range(5)])
    rows = await _page_all(store, TaskQuery(limit=4))
    assert len(rows) == len({r.id for r in rows}) == 28
    assert {r.id for r in rows} == {t.id for t in made}
    keys = [(r.created_at_ms, r.id) for r in rows]
    assert keys == sorted(keys, reverse=True)
    only_q = await _page_all(store, TaskQuery(queue="q", limit=5))
    assert len(only_q) == 23 and {r.queue for r in only_q} == {"q"}
    by_name = await _page_all(store, TaskQuery(name="m", sort="run_at", limit=2))
    assert len(by_name) == 5
    assert await store.dashboard.browse(TaskQuery(sort="finished")) == []
    later = await store.dashboard.browse(TaskQuery(from_ms=store.now_ms() + 60_000))
    assert later == []


async def test_key_filter_and_task_key(store: TaskStore) -> None:
    keyed = await store.submit(name="n", key="the-key")
    await store.submit(name="n")
    (row,) = await store.dashboard.browse(TaskQuery(key="the-key"))
    assert row.id == keyed.id
    assert await store.dashboard.browse(TaskQuery(key="no-such-key")) == []
    assert await store.dashboard.browse(TaskQuery(key="the-key", status="failed")) == []
    assert await store.dashboard.task_key(keyed.id) == "the-key"


async def test_failed_groups_retry_and_discard(store: TaskStore) -> None:
    a = [await _fail(store, "q", "ValueError") for _ in range(3)]
    b = await _fail(store, "q", "KeyError")
    groups = await store.dashboard.failed_groups()
    assert [(g.name, g.error_type, g.n) for g in groups] == [
        ("boom", "ValueError", 3),
        ("boom", "KeyError", 1),
    ]
    assert groups[0].message == "<ValueError>"
    ids = await store.dashboard.failed_group_ids("boom", "ValueError", limit=2)
    assert ids == sorted(a)[:2]
    assert (
        await store.dashboard.failed_group_ids("boom", "ValueError", after_id=ids[-1])
        == sorted(a)[2:]
    )
    assert await store.dashboard.discard_failed([b, a[0]]) == [b, a[0]]
    assert await store.get(b) is None
    assert await store.dashboard.discard_failed([b]) == []
    finished = await store.dashboard.finished_per_minute(store.now_ms() - 3_600_000)
    assert sum(c.n for c in finished if c.status == "failed") == 2
    assert {c.minute for c in finished} <= {store.now_ms() // 60_000, store.now_ms() // 60_000 - 1}
    rows = await _page_all(store, TaskQuery(sort="finished", status="failed", limit=1))
    assert len(rows) == 2


async def test_bad_queries_are_value_errors(store: TaskStore) -> None:
    with pytest.raises(ValueError, match="sort must be one of"):
        await store.dashboard.browse(TaskQuery(sort="priority"))
    with pytest.raises(ValueError, match="status must be one of"):
        await store.dashboard.browse(TaskQuery(status="done"))
    with pytest.raises(ValueError, match="limit"):
        await store.dashboard.browse(TaskQuery(limit=0))


# -- SQLite's plans ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    """5,000 tasks in every status over 3 queues, then ANALYZE."""
    path = str(tmp_path_factory.mktemp("dashplans") / "plans.db")

    async def create() -> None:
        s = SQLiteStore(path)
        await s.connect()
        await s.ensure_schema("dashboard_indexes")  # what a serving dashboard builds
        await s.close()

    asyncio.run(create())
    now = int(time.time() * 1000)
    statuses = ("queued", "running", "succeeded", "succeeded", "succeeded", "failed", "canceled")
    rows = []
    for i in range(5000):
        status = statuses[i % len(statuses)]
        done = now - 100_000 + i if status in ("succeeded", "failed", "canceled") else None
        rows.append((f"task_{i:026d}", ("a", "b")[i % 2], ("q1", "q2", "q3")[i % 3], status,
                     now - 1000 + i, now - 5000 + i, now, done))  # fmt: skip
    with closing(sqlite3.connect(path)) as conn:
        conn.executemany(
            """insert into cairnq_tasks (id, name, queue, status, payload, metadata,
                   run_at_ms, created_at_ms, updated_at_ms, completed_at_ms)
               values (?, ?, ?, ?, '{}', '{}', ?, ?, ?, ?)""",
            rows,
        )
        conn.commit()
        conn.execute("analyze")
    conn = sqlite3.connect(path)
    try:
        yield conn
    finally:
        conn.close()


def _plan(conn: sqlite3.Connection, query: TaskQuery) -> str:
    params = query.params()
    stmt = statement("sqlite", f"extensions/dashboard_tasks_{query.sort}",
                     TaskQuery.supplied(params))  # fmt: skip
    bound = sqlite_statements.bind(stmt, params, wall_clock_ms)
    return "\n".join(r[3] for r in conn.execute("explain query plan " + stmt.text, bound))


@pytest.mark.parametrize(
    "query",
    [
        TaskQuery(),
        TaskQuery(status="failed"),
        TaskQuery(queue="q2"),
        TaskQuery(sort="run_at"),
        TaskQuery(sort="run_at", status="queued"),
        TaskQuery(sort="finished"),
        TaskQuery(sort="finished", status="succeeded"),
        TaskQuery(cursor=(1, "task_x")),
    ],
    ids=str,
)
def test_sqlite_task_pages_read_an_index_in_order(
    seeded: sqlite3.Connection, query: TaskQuery
) -> None:
    plan = _plan(seeded, query)
    assert "USE TEMP B-TREE FOR ORDER BY" not in plan, plan
    assert "SCAN cairnq_tasks\n" not in plan + "\n" and not plan.startswith("SCAN cairnq_tasks "), (
        plan
    )


@pytest.mark.parametrize("sort", ["created", "run_at", "finished"])
@pytest.mark.parametrize("status", [None, "succeeded"])
def test_sqlite_a_deep_page_costs_what_the_first_does(
    seeded: sqlite3.Connection, sort: str, status: str | None
) -> None:
    """Keyset paging proper: the cursor bounds the index range, so a page near the end
    of the table does not step over the rows before it."""
    first = _steps(seeded, TaskQuery(sort=sort, status=status, limit=20))
    deep = _steps(seeded, TaskQuery(sort=sort, status=status, limit=20, cursor=_deep(sort)))
    assert deep < first * 3, (first, deep)
    assert first < 20_000, first


def _deep(sort: str) -> tuple[int, str]:
    now = int(time.time() * 1000)
    # Rows are numbered by age; cursor at row 300 of 5,000 counting from the oldest.
    return {"created": now - 5000 + 300, "run_at": now - 1000 + 300,
            "finished": now - 100_000 + 300}[sort], f"task_{300:026d}"  # fmt: skip


def _steps(conn: sqlite3.Connection, query: TaskQuery) -> int:
    """SQLite virtual-machine steps the page takes (counted every 100 instructions)."""
    params = query.params()
    stmt = statement("sqlite", f"extensions/dashboard_tasks_{query.sort}",
                     TaskQuery.supplied(params))  # fmt: skip
    bound = sqlite_statements.bind(stmt, params, wall_clock_ms)
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    conn.set_progress_handler(tick, 100)
    try:
        rows = conn.execute(stmt.text, bound).fetchall()
    finally:
        conn.set_progress_handler(None, 0)
    assert len(rows) == 20
    return count[0]


async def test_daemon_reports(store: TaskStore) -> None:
    await store.reports.put("h1/1", "h1", '{"pid": 1}')
    await store.reports.put("h1/1", "h1", '{"pid": 1, "generation": 2}')
    await store.reports.put("h2/7", "h2", '{"pid": 7}')
    reports = await store.reports.all()
    assert [(r.daemon, r.snapshot) for r in reports] == [
        ("h1/1", '{"pid": 1, "generation": 2}'),
        ("h2/7", '{"pid": 7}'),
    ]
    assert all(0 <= r.age_ms < 60_000 for r in reports)
    assert await store.reports.prune(3_600_000) == 0
    with pytest.raises(ValueError, match="snapshot is longer"):
        await store.reports.put("h3/1", "h3", "x" * 1_000_001)


def test_sqlite_finished_per_minute_reads_the_last_hour_only(seeded: sqlite3.Connection) -> None:
    stmt = statement("sqlite", "extensions/dashboard_throughput")
    bound = sqlite_statements.bind(stmt, {"since_ms": 0}, wall_clock_ms)
    plan = "\n".join(r[3] for r in seeded.execute("explain query plan " + stmt.text, bound))
    assert "cairnq_tasks_status_completed_idx (status=? AND completed_at_ms>?)" in plan, plan
