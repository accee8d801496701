"""cairnqd_0010_attempts.sql on a database that already holds tasks, on both dialects:
it applies, tasks from before have no records (and settle as before), and the next
claim starts recording."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cairnqd.store.base import TaskStore
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore
from tests.protocol.sqldb import (
    PgDatabases,
    pg_apply,
    pg_url,
    sqlite_apply,
    sqlite_connect,
)
from tests.protocol.sqlfiles import extension_migration_files, migration_files

_BEFORE = "cairnqd_0010"

_ROW = (
    "insert into cairnq_tasks (id, name, queue, status, payload, attempt, max_attempts, "
    "worker_id, lease_until_ms, run_at_ms, completed_at_ms, created_at_ms, updated_at_ms) "
    "values (%s)"
)


def _rows() -> list[tuple[Any, ...]]:
    now = int(time.time() * 1000)
    return [
        # Running under w_old when the migration lands; done long ago; still queued.
        ("task_running", "n", "default", "running", "{}", 1, 3, "w_old", now + 60_000,
         now - 1_000, None, now - 2_000, now - 1_000),
        ("task_done", "n", "default", "succeeded", "{}", 1, 3, "w_old", None,
         now - 9_000, now - 8_000, now - 9_000, now - 8_000),
        ("task_waiting", "n", "default", "queued", "{}", 0, 3, None, None,
         now - 1_000, None, now - 1_000, now - 1_000),
    ]  # fmt: skip


async def _check_after(store: TaskStore) -> None:
    async with store:
        for task_id in ("task_running", "task_done", "task_waiting"):
            assert await store.attempts.of(task_id) == []
        # The attempt that ran across the migration has no record to close: it settles
        # as before, and the history stays empty rather than wrong.
        await store.complete(task_id="task_running", worker_id="w_old", result=None)
        assert await store.attempts.of("task_running") == []
        claimed = await store.claim(queues=["default"], worker_id="w_new")
        assert [t.id for t in claimed] == ["task_waiting"]
        records = await store.attempts.of("task_waiting")
        assert [(r.attempt, r.worker_id, r.outcome) for r in records] == [(1, "w_new", None)]
        assert await store.purge(older_than_ms=0, status="succeeded") != []


async def test_sqlite_database_with_tasks(tmp_path: Path) -> None:
    path = tmp_path / "before.db"
    conn = sqlite_connect(path)
    sqlite_apply(conn, migration_files("sqlite"), "cairnq")
    earlier = [p for p in extension_migration_files("sqlite") if p.name < _BEFORE]
    sqlite_apply(conn, earlier, "cairnqd")
    for row in _rows():
        conn.execute(_ROW % ", ".join("?" * len(row)), row)
    conn.commit()
    conn.close()
    await _check_after(SQLiteStore(str(path)))


async def test_postgres_database_with_tasks(pg: PgDatabases) -> None:
    name = pg.create("attempts_before")
    with pg.connect(name) as conn:
        pg_apply(conn, migration_files("postgres"), "cairnq")
        earlier = [p for p in extension_migration_files("postgres") if p.name < _BEFORE]
        pg_apply(conn, earlier, "cairnqd")
        with conn.transaction():
            for row in _rows():
                conn.execute(_ROW % ", ".join(["%s"] * len(row)), row)
        assert conn.execute("select to_regclass('cairnqd_attempts') as t").fetchone() == {"t": None}
    await _check_after(PostgresStore(pg_url(name)))
