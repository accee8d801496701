"""The plans attempt history relies on, pinned (cairnqd_0010_attempts.sql).

Postgres: the trigger's statements run on cached plans, first made for whatever the
first statement on the connection held; a claim of 256 rows and their settlement after a
one-row claim must still probe indexes per row, never scan a table nor join two
transition tables in a nested loop. auto_explain reports each nested statement's plan as
it runs. SQLite: the row triggers' statements and the history read search the table's
key (task_id, attempt, started_at_ms).
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import psycopg

from cairnqd._protocol import statement
from cairnqd.store.base import wall_clock_ms
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore
from cairnqd.store.sqlite import statements as sqlite_statements

_SEED = """
insert into cairnq_tasks (id, name, queue, status, payload, attempt, max_attempts,
    worker_id, run_at_ms, created_at_ms, updated_at_ms, completed_at_ms)
select 'task_' || lpad(g::text, 26, '0'), 'n', 'q',
    case when g <= 400 then 'queued' else 'succeeded' end, '{}',
    case when g <= 400 then 0 else 1 end, 3, null, g, g, g,
    case when g <= 400 then null else g end
from generate_series(1, 20000) as g
"""
_SEED_ATTEMPTS = """
insert into cairnqd_attempts (task_id, attempt, worker_id, started_at_ms, finished_at_ms,
    outcome)
select 'task_' || lpad(g::text, 26, '0'), 1, 'w0', g, g, 'succeeded'
from generate_series(401, 20000) as g
"""
_CLAIM = """
update cairnq_tasks set status = 'running', worker_id = 'w', attempt = attempt + 1,
    lease_until_ms = 9000000000000, updated_at_ms = 1
where id in (select id from cairnq_tasks where status = 'queued' order by id limit %s)
"""
_SETTLE = """
update cairnq_tasks set status = 'succeeded', lease_until_ms = null, completed_at_ms = 2,
    updated_at_ms = 2
where status = 'running'
"""


def _plans(conn: psycopg.Connection[Any], sql: str, *args: Any) -> list[str]:
    seen: list[str] = []

    def note(diagnostic: psycopg.errors.Diagnostic) -> None:
        seen.append(diagnostic.message_primary or "")

    conn.add_notice_handler(note)
    try:
        conn.execute(sql, args or None)
    finally:
        conn.remove_notice_handler(note)
    return seen


def test_postgres_trigger_plans_scale_with_the_rows(pg_dsn: str) -> None:
    asyncio.run(_migrate(PostgresStore(pg_dsn)))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(_SEED)
        conn.execute(_SEED_ATTEMPTS)
        conn.execute("analyze cairnq_tasks")
        conn.execute("analyze cairnqd_attempts")
        # One row first: the cached plans are made for a transition table of one row.
        conn.execute(_CLAIM, (1,))
        conn.execute(_SETTLE)
        conn.execute("load 'auto_explain'")
        conn.execute("set auto_explain.log_min_duration = 0")
        conn.execute("set auto_explain.log_nested_statements = on")
        conn.execute("set auto_explain.log_level = notice")
        conn.execute("set client_min_messages = notice")
        claim = _trigger_plans(_plans(conn, _CLAIM, 256))
        settle = _trigger_plans(_plans(conn, _SETTLE))
        count = conn.execute(
            "select count(*), count(finished_at_ms) from cairnqd_attempts where worker_id = 'w'"
        ).fetchone()
    assert count == (257, 257)
    assert any("Insert on cairnqd_attempts" in p for p in claim), claim
    assert any("Update on cairnqd_attempts" in p for p in settle), settle
    for plan in claim + settle:
        assert "Seq Scan on" not in plan, plan
        if any(join in plan for join in ("Nested Loop", "Hash Join", "Merge Join")):
            assert plan.count("Named Tuplestore Scan") <= 1, "two transition tables joined"
    # Closing pairs each old row with its task by primary key and its record by index.
    closing = "\n".join(settle)
    assert "Index Scan using cairnq_tasks_pkey on cairnq_tasks t" in closing, closing
    assert "cairnqd_attempts_task_idx" in closing, closing


_GROW = (
    """insert into cairnqd_attempts (task_id, attempt, worker_id, started_at_ms,
        finished_at_ms, outcome)
    select 'old_' || g, 1, 'w0', g, g, 'succeeded'
    from generate_series(%s::integer, %s::integer) as g""",
    """insert into cairnqd_task_deps (task_id, parent_id, position)
    select 'child_' || g, 'old_' || g, 0 from generate_series(%s::integer, %s::integer) as g""",
)


def _grow(conn: psycopg.Connection[Any], first: int, last: int) -> None:
    """Old attempt records and dependency edges, none of them the seeded tasks'."""
    for sql in _GROW:
        conn.execute(sql, (first, last))


def test_postgres_trigger_plans_made_on_small_tables_still_probe_grown_ones(
    pg_dsn: str,
) -> None:
    """A connection's trigger plans are made while the attempt and dependency tables are
    small (autovacuum analyzed them at a hundred rows); the tables then grow with no
    ANALYZE since. Settling must still probe them by index, not read them whole: a scan
    made each settle of a drain slower than the last (cairnqd_0015_trigger_plans.sql)."""
    asyncio.run(_migrate(PostgresStore(pg_dsn)))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(_SEED)
        _grow(conn, 1, 100)
        conn.execute("analyze cairnqd_attempts")
        conn.execute("analyze cairnqd_task_deps")
        # Past PL/pgSQL's five custom plans: from here on the cached generic ones run.
        for _ in range(8):
            conn.execute(_CLAIM, (1,))
            conn.execute(_SETTLE)
        _grow(conn, 101, 20000)
        conn.execute("load 'auto_explain'")
        conn.execute("set auto_explain.log_min_duration = 0")
        conn.execute("set auto_explain.log_nested_statements = on")
        conn.execute("set auto_explain.log_level = notice")
        conn.execute("set client_min_messages = notice")
        conn.execute(_CLAIM, (32,))
        settle = _trigger_plans(_plans(conn, _SETTLE))
    assert any("Update on cairnqd_attempts" in p for p in settle), settle
    for plan in settle:
        assert "Seq Scan on cairnqd_" not in plan, plan


def _trigger_plans(notices: list[str]) -> list[str]:
    """The plans of the statements the triggers ran: the test's own name no table of ours."""
    return [n for n in notices if "cairnqd_" in n]


async def _migrate(store: Any) -> None:
    await store.connect()
    await store.close()


def test_sqlite_trigger_statements_use_the_index(tmp_path: Any) -> None:
    path = str(tmp_path / "plans.db")
    asyncio.run(_migrate(SQLiteStore(path)))
    with sqlite3.connect(path) as conn:
        probes = [
            "update cairnqd_attempts set outcome = 'failed' "
            "where task_id = ? and attempt = ? and finished_at_ms is null",
            "delete from cairnqd_attempts where task_id = ? and attempt = ?",
            "delete from cairnqd_attempts where task_id = ?",
        ]
        for sql in probes:
            args = ("t", 1) if sql.count("?") == 2 else ("t",)
            plan = [r[3] for r in conn.execute("explain query plan " + sql, args)]
            assert any("USING PRIMARY KEY (task_id=?" in p for p in plan), plan
        stmt = statement("sqlite", "extensions/attempts_of", frozenset())
        bound = sqlite_statements.bind(stmt, {"task_id": "t"}, wall_clock_ms)
        plan = [r[3] for r in conn.execute("explain query plan " + stmt.text, bound)]
        assert any("USING PRIMARY KEY (task_id=?)" in p for p in plan), plan
