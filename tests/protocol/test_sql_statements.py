"""The statement files: the inventory, their parameters and conventions, and that each runs.

Every operation has one file per dialect (a few are dialect-only); each names only known
parameters, holds one statement, keeps the shared predicates verbatim, and executes on a
migrated database returning the expected number of rows. The claim variants are claim.sql
with specialized predicates and nothing else.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cairnqd.store.arguments import insert_params_for
from cairnqd.store.statement_params import insert_many_params
from tests.protocol.sqldb import PgDatabases, pg_ours, sqlite_ours
from tests.protocol.sqlfiles import (
    DIALECTS,
    PARAM,
    normalize,
    statement_files,
    statement_text,
    strip_comments,
    to_psycopg,
)
from tests.protocol.sqlrun import HANDLER_ERROR, now_ms


def _params(dialect: str) -> dict[str, Any]:
    """A superset of every statement's parameters, bound the store's way."""
    now = now_ms()
    sqlite = dialect == "sqlite"

    def lst(values: list[str] | None) -> Any:
        return json.dumps(values) if sqlite and values is not None else values

    return {
        "id": "task_run",
        "name": "n",
        "queue": "default",
        "payload": '{"a": 1}',
        "metadata": "{}",
        "max_attempts": 3,
        "priority": 0,
        "parent_id": None,
        "root_id": "task_run",
        "correlation_id": None,
        "now_ms": now,
        "run_at_ms": now,
        "lease_until_ms": now + 30_000,
        "before_ms": now,
        "lease_ms": 30_000,
        "delay_ms": 0,
        "older_than_ms": 0,
        "key": "k",
        "task_id": "task_run",
        "status": None,
        "limit": 10,
        "offset": 0,
        "reset_attempt": 0 if sqlite else False,
        "retryable": 1 if sqlite else True,
        "queues": lst(["default", "other"]),
        "names": None,
        "ids": lst(["task_run", "task_missing"]),
        "worker_id": "w1",
        "attempt": 1,
        "progress": 0.5,
        "message": "half",
        "result": '{"ok": true}',
        "error": HANDLER_ERROR,
        "max_depth": 5,
        "items": json.dumps([{"id": "task_run", "r": '{"ok": true}'}]),
        "unstarted": json.dumps([{"id": "task_run", "a": 1}]),
        # Operator interruptions (cairnqd_interruptions): task_run is w1's, at attempt 1.
        "interrupted": json.dumps([{"id": "task_run", "a": 1}]),
        "cap": 3,
        "running": "running",
        "outcome": "handed_back",
        "detail": "shutdown",
        "table_name": "cairnq_migrations",
        # The operator's controls: queue pauses and bulk actions (store/operator.py).
        "paused_by": "ops@host",
        "reason": None,
        "statuses": lst(["failed", "running"]),
        # Flow-control limits (store/limits.py).
        "limit_name": "smtp",
        "part": "(none)",
        "kind": "concurrency",
        "slot": 0,
        "capacity": 2,
        "until_ms": now + 1000,
        "pending": json.dumps([{"task_id": "task_q", "attempt": 1}]),
        "holders": json.dumps([{"rn": 1, "task_id": "task_q", "attempt": 1}]),
        "held": json.dumps([{"task_id": "task_q", "attempt": 1}]),
        "n": 1,
        "held_ms": 1 << 62,
        "forget_before_ms": now - 3_600_000,
        "seen": json.dumps(
            [{"id": "task_run", "worker_id": "w1", "name": "n", "queue": "default"}]
        ),
        "window_ms": 1000,
        # The per-queue counters (cairnqd/queue_counts.py).
        "counts": json.dumps([{"w": 60, "t": 0, "q": "default", "s": "wait", "b": 0, "n": 1}]),
        "width_s": 60,
        "cutoff_ms": now,
        # `cairnqd top`'s window (TaskStore.recent_counts).
        "from_id": "",
        "path": None,
        "globs": lst([]),
        "parts": lst(["(none)"]),
        "concurrency": 2,
        "rate_count": None,
        "rate_window_ms": None,
        "set_by": "ops@host",
        "created_after_ms": None,
        "created_before_ms": None,
        "after_id": "",
        # The daemon's session locks (two-int4 advisory key space).
        "lock_namespace": 1668378212,
        "lock_id": 1,
        # insert_many (Postgres): one JSON array of objects.
        **_insert_many_params(),
        # The scheduler's table (cairnqd_schedules).
        "rule": "every 1s",
        "at_ms": now,
        "slot_ms": now,
        "skipped": 2,
        # Task dependencies (store/dependencies.py): task_run waits on two seeds.
        "parents": lst(["task_q", "task_done"]),
        "failed_by": None,
        "host": "host-1",
        # Lease rows (cairnqd_leases): leadership behind a transaction pooler.
        "holder": "host-1:123:ab",
        "ttl_ms": 15_000,
        "every_ms": 600_000,
        "grace_ms": 300_000,
        # The dashboard's reads (keyset pages: every row is older than the cursor).
        "from_ms": 0,
        "upper_ms": now + 10**9,
        "cursor_ms": now + 10**9,
        "cursor_id": "",
        "since_ms": 0,
        "error_type": "",
        "daemon": "host-1:123",
        "snapshot": "{}",
        # The search box: the text looked for, and the window of newest tasks.
        "text": "n",
        "scan": 1000,
        # The fleet registry (cairnqd_fleet).
        "pid": 123,
        "config": "/etc/cairnq.yaml",
        "version": "0.2.0",
        "pipe_protocol": 2,
        "features": '["fleet", "pauses"]',
        "groups": '["default"]',
        "live_ms": 20_000,
    }


def _insert_many_params() -> dict[str, Any]:
    # Postgres's; SQLite's insert_many is a row statement (_sqlite_values).
    params = insert_params_for({"name": "n", "payload": {"a": 1}}, "task_many")
    return insert_many_params([params])


def _copy_row() -> tuple[Any, ...]:
    """One row for insert_copy, in its column order."""
    now = now_ms()
    return ("task_copied", "n", "default", '{"a": 1}', "{}", 3, 0, None, "task_copied",
            None, now, now, now, "queued")  # fmt: skip


def _sqlite_values(text: str) -> list[Any] | None:
    """A row statement's values for two rows (SQLite's insert_many: its `values` row
    repeated, as the store runs it), or None for a statement of named parameters."""
    if "?" not in text:
        return None
    now = now_ms()
    rows = [
        # id, name, queue, payload, metadata, max_attempts, priority, parent_id,
        # root_id, correlation_id, run_at_ms, created_at_ms, updated_at_ms
        (
            *(f"task_many{i}", "n", "default", '{"a": 1}', "{}", 3, 0),
            *(None, f"task_many{i}", None, now, now, now),
        )
        for i in range(2)
    ]
    assert text.count("?") == len(rows[0])  # the order insert_rows binds in
    return [value for row in rows for value in row]


# An expected row count of AT_LEAST_ONE: the ledgers hold one row per applied migration.
AT_LEAST_ONE = -1

# The dashboard's task list with no filter.
_NO_FILTERS = ("status", "queue", "name", "task_id")

# op -> (overrides, expected row count or None when the statement returns nothing)
_STATEMENT_CASES: dict[str, tuple[dict[str, Any], int | None]] = {
    "sql/protocol_version": ({}, 1),
    "sql/installations": ({}, 1),
    "sql/lock_key": ({}, 1),
    "sql/insert_task": ({"id": "task_new"}, 1),
    "sql/get_key": ({}, 1),
    "sql/upsert_key": ({"key": "k2"}, None),
    "sql/get": ({}, 1),
    "sql/get_by_key": ({}, 1),
    "sql/get_status": ({}, 1),
    "sql/get_status_by_key": ({}, 1),
    "sql/list": (dict.fromkeys(("status", "queue", "name", "root_id", "correlation_id")), 4),
    "sql/cancel": ({}, 1),
    "sql/retry": ({"id": "task_done"}, 1),
    "sql/purge": (dict.fromkeys(("status", "queue", "name")), 1),
    "sql/stats": ({"queue": None}, 4),
    "sql/queue_depth": ({}, 1),
    "sql/claimable_probe": ({}, 1),
    "sql/recover_leases": ({}, 1),
    "sql/claim": ({}, 1),
    "sql/claim_one_queue": ({}, 1),
    "sql/claim_one_name": ({}, 1),
    "sql/claim_one_queue_one_name": ({}, 1),
    "sql/heartbeat": ({}, 1),
    "sql/heartbeat_batch": ({}, 1),
    "sql/progress": ({}, 1),
    "sql/complete": ({}, 1),
    "sql/succeed": ({}, 1),
    "sql/fail": ({}, 1),
    "sql/ledger_create": ({}, None),
    "sql/ledger_lock": ({}, None),
    "sql/ledger_applied": ({"name": "0001_init.sql"}, 1),
    "sql/ledger_record": ({"name": "9999_test.sql"}, None),
    "extensions/ledger_create": ({}, None),
    "extensions/ledger_lock": ({}, None),
    "extensions/ledger_applied": ({"name": "cairnqd_0001_task_keys_task_idx.sql"}, 1),
    "extensions/ledger_record": ({"name": "cairnqd_9999_test.sql"}, None),
    "extensions/release_worker": ({}, 1),
    "extensions/return_unstarted": ({}, 1),
    # No fixture task has a cancel requested while it runs.
    "extensions/cancel_flags": ({}, 0),
    "extensions/fail_undecodable": ({}, 1),
    "extensions/complete_many": ({}, 1),
    # w1 holds task_run at attempt 1; the item for another attempt renews nothing.
    "extensions/renew_leases": (
        {"items": json.dumps([{"id": "task_run", "a": 1}, {"id": "task_run", "a": 2}])},
        1,
    ),
    "extensions/insert_many": ({}, 1),
    # A COPY: run with one streamed row (test_postgres_statements_execute).
    "extensions/insert_copy": ({}, None),
    "extensions/clock_ms": ({}, 1),
    "extensions/purge_count": (dict.fromkeys(("status", "queue", "name")), 1),
    "extensions/connection_limits": ({}, 1),
    "extensions/vacuum_due": ({}, 1),
    # Nobody waits on a lock while the test runs: no blocker to name.
    "extensions/lock_blockers": ({}, 0),
    "sql/ledger_names": ({}, AT_LEAST_ONE),
    "sql/ledger_list": ({}, AT_LEAST_ONE),
    "sql/ledger_exists": ({"table_name": "cairnq_migrations"}, 1),
    "extensions/ledger_names": ({}, AT_LEAST_ONE),
    "extensions/ledger_list": ({}, AT_LEAST_ONE),
    "extensions/oldest_queued": ({}, 1),
    # Every seed row's id sorts above the empty floor; the one ended row is in the window.
    "extensions/recent_submitted": ({}, AT_LEAST_ONE),
    "extensions/recent_finished": ({"since_ms": 0}, AT_LEAST_ONE),
    "extensions/leases_expired": ({}, 1),
    "extensions/try_session_lock": ({}, 1),
    "extensions/release_session_lock": ({}, 1),
    "extensions/wal_checkpoint": ({}, 1),
    "extensions/queue_pause": ({}, 1),
    "extensions/queue_resume": ({"queue": "never_paused"}, 0),
    "extensions/queue_pauses": ({}, 0),
    "extensions/task_ids": ({}, 2),
    "extensions/task_count": ({}, 1),
    # The table starts empty: the writes match no row, the reads find none.
    "extensions/schedule_ensure": ({}, None),
    "extensions/schedule_rule": ({}, 0),
    "extensions/schedule_advance": ({}, 0),
    "extensions/schedule_fired": ({}, None),
    "extensions/schedule_skip": ({}, 0),
    "extensions/schedule_failed": ({}, None),
    "extensions/schedule_leader": ({}, None),
    "extensions/schedule_manual": ({}, None),
    "extensions/schedule_list": ({}, 0),
    # The table starts empty: the first take and turn insert the row and return it.
    "extensions/lease_take": ({"name": "lock:1:2"}, 1),
    "extensions/lease_turn": ({"name": "purge:1"}, 1),
    "extensions/lease_release": ({"name": "lock:1:2"}, None),
    # The dashboard: the seed has one failed task (no error, so error type ''), a key on
    # task_run, and no daemon reports yet.
    "extensions/dashboard_tasks_created": (dict.fromkeys(_NO_FILTERS), 4),
    "extensions/dashboard_tasks_run_at": (dict.fromkeys(_NO_FILTERS), 4),
    "extensions/dashboard_tasks_finished": (dict.fromkeys(_NO_FILTERS), 1),
    "extensions/dashboard_failed_groups": ({}, 1),
    "extensions/dashboard_failed_ids": ({"name": "n"}, 1),
    "extensions/dashboard_discard": ({"id": "task_done"}, 1),
    "extensions/dashboard_task_key": ({"id": "task_run"}, 1),
    "extensions/dashboard_report": ({}, None),
    "extensions/dashboard_reports": ({}, 0),
    "extensions/dashboard_reports_prune": ({}, 0),
    # The search box: three seeds are named "n"; the window holds all four, none beyond.
    "extensions/dashboard_search": ({}, 3),
    "extensions/dashboard_search_beyond": ({}, 0),
    # The fleet starts empty (each statement runs alone, rolled back): no row to stamp,
    # list or forget; the features are the migration's own rows.
    "extensions/fleet_join": ({}, None),
    "extensions/fleet_beat": ({}, 0),
    "extensions/fleet_members": ({"since_ms": 60_000}, 0),
    "extensions/fleet_leave": ({}, 0),
    "extensions/fleet_prune": ({"older_than_ms": 86_400_000}, 0),
    "extensions/fleet_features": ({}, AT_LEAST_ONE),
    # Limits: the draw finds the one queued task; the slot table starts empty.
    "extensions/limit_candidates": ({}, 1),
    "extensions/limit_claim_ids": ({}, 0),
    # No slot exists: nothing is claimed, and the one row says so (room 0).
    "extensions/limit_claim_room": ({}, 1),
    "extensions/limit_slots_take": ({}, 0),
    "extensions/limit_slots_untake": ({}, None),
    "extensions/limit_slots_release": ({}, None),
    "extensions/limit_slots_ensure": ({}, None),
    "extensions/limit_slots_reclaim": ({}, 0),
    "extensions/limit_rate_opens": ({}, 1),
    # The slot table starts empty: no row (SQLite's count of running tasks: below).
    "extensions/limit_usage": ({}, 0),
    # SQLite's count of a limit's running tasks: task_run and task_stale run (both
    # leased), in the one partition '(none)'.
    "extensions/limit_running": ({}, 1),
    "extensions/limit_worker_note": ({}, None),
    "extensions/limit_workers_prune": ({"forget_before_ms": 0}, None),
    "extensions/limit_waiting": ({}, 1),
    # The per-queue counters start empty: the add inserts, the read and prune find none.
    "extensions/queue_counts_add": ({}, None),
    "extensions/queue_counts_read": ({}, 0),
    "extensions/queue_counts_prune": ({}, None),
    "extensions/limit_bypass": ({}, 2),  # the two running seeds hold no slot
    "extensions/limit_bypass_note": ({}, None),
    "extensions/limit_bypass_seen": ({}, 0),
    "extensions/limit_bypass_prune": ({"forget_before_ms": 0}, None),
    "extensions/limit_override_set": ({}, 1),
    "extensions/limit_overrides": ({}, 0),
    "extensions/limit_overrides_clear": ({}, 0),
    # Why a task waits: task_q is queued and due. On Postgres its partition has no
    # slots yet (one row, kind null); on SQLite one row per kind (the running tasks
    # counted, the rate's starts). Its queue holds one due task in the partition
    # '(none)'.
    "extensions/limit_room_task": ({"id": "task_q"}, AT_LEAST_ONE),
    "extensions/limit_room_queues": ({}, 1),
    # The table starts empty: w1's running task_run is counted once; nothing to forget.
    "extensions/interruption_give": ({}, 1),
    "extensions/interruption_prune": ({}, None),
    # Attempt history: the seed inserts its running rows (no claim), so no record exists;
    # naming a hand-back finds nothing to name.
    "extensions/attempts_of": ({}, 0),
    "extensions/attempts_interrupted": (
        {"items": json.dumps([{"id": "task_run", "a": 1}])},
        None,
    ),
    "extensions/attempts_hand_back": (
        {"items": json.dumps([{"id": "task_run", "a": 1, "s": "queued"}])},
        None,
    ),
    # Dependencies: the tables start empty, so task_run has no edge to read or wait on
    # (no wait row written, none counted); the link writes two, the hold one task.
    "extensions/dependency_parents": ({}, 1),
    "extensions/dependency_link": ({}, None),
    "extensions/dependency_closure": ({}, None),
    "extensions/dependency_wait": ({}, 0),
    "extensions/dependency_hold": ({}, 1),
    "extensions/dependency_tasks": ({}, 0),
    "extensions/dependency_waiting": ({}, 0),
    # task_run waits for nothing: it is its own graph's one root and member.
    "extensions/dependency_dependents": ({}, 0),
    "extensions/dependency_dependents_count": ({}, 1),
    "extensions/dependency_graph": ({}, 1),
    "extensions/dependency_graph_edges": ({}, 0),
    "extensions/dependency_waiting_list": ({"queue": None, "name": None}, 0),
}

#: Where a dialect's answer differs: SQLite counts a limit's running tasks instead of
#: its slots (task_run and task_stale, one row for the partition '(none)').
_SQLITE_COUNTS = {"extensions/limit_usage": 1}

#: What the store fills into a composed statement's `{part}`s for a draw that meets
#: no limit yet (store/limits.py).
_FILLED = {
    "{scope}": "queue = :queue",
    "{partitions}": "",
    "{excluded}": "false",
    "{cover}": "1",
    "{part}": "'(none)'",
}


def _filled(text: str) -> str:
    for marker, fill in _FILLED.items():
        text = text.replace(marker, fill)
    return text


_PG_ONLY = {
    "extensions/limit_claim_room",
    "extensions/insert_copy",
    "extensions/clock_ms",
    "extensions/connection_limits",
    "extensions/vacuum_due",
    "extensions/lock_blockers",
    "sql/installations",
    "sql/lock_key",
    "sql/ledger_lock",
    "extensions/ledger_lock",
    "extensions/try_session_lock",
    "extensions/release_session_lock",
    "extensions/lease_take",
    "extensions/lease_turn",
    "extensions/lease_release",
}
_SQLITE_ONLY = {
    "extensions/wal_checkpoint",
    "extensions/limit_running",
    "extensions/limit_worker_note",
    "extensions/limit_workers_prune",
}


def test_statement_inventory() -> None:
    for dialect in DIALECTS:
        only_other = _SQLITE_ONLY if dialect == "postgres" else _PG_ONLY
        expected = {op for op in _STATEMENT_CASES if op not in only_other}
        assert set(statement_files(dialect)) == expected, dialect


def _seed_rows() -> list[tuple[str, str, str, str, str | None, int | None, int, int | None]]:
    """(id, queue, name, status, worker_id, lease_until_ms, run_at_ms, completed_at_ms)."""
    now = now_ms()
    return [
        ("task_run", "default", "n", "running", "w1", now + 60_000, now - 5_000, None),
        ("task_q", "default", "n", "queued", None, None, now - 1_000, None),
        ("task_done", "default", "n", "failed", "w1", None, now - 200_000, now - 100_000),
        ("task_stale", "other", "m", "running", "w0", now - 1_000, now - 10_000, None),
    ]


_SEED_SQL = (
    "insert into cairnq_tasks (id, name, queue, status, payload, attempt, max_attempts, "
    "worker_id, lease_until_ms, run_at_ms, completed_at_ms, created_at_ms, updated_at_ms) "
    "values (:id, :name, :queue, :status, '{}', :attempt, 3, :worker_id, :lease, :run_at, "
    ":completed, :created, :created)"
)


def _seed(execute: Callable[[str, dict[str, Any]], Any]) -> None:
    for i, (tid, queue, name, status, worker, lease, run_at, completed) in enumerate(_seed_rows()):
        execute(
            _SEED_SQL,
            {
                "id": tid,
                "name": name,
                "queue": queue,
                "status": status,
                "attempt": 0 if status == "queued" else 1,
                "worker_id": worker,
                "lease": lease,
                "run_at": run_at,
                "completed": completed,
                "created": run_at + i,
            },
        )
    execute(
        "insert into cairnq_task_keys (key, task_id, created_at_ms, updated_at_ms) "
        "values ('k', 'task_run', 1, 1)",
        {},
    )


def _check_count(op: str, rows: list[Any] | None, expected: int | None) -> None:
    if expected == AT_LEAST_ONE:
        assert rows, op
    else:
        assert (None if rows is None else len(rows)) == expected, op


def test_sqlite_statements_execute(tmp_path: Path) -> None:
    conn = sqlite_ours(tmp_path / "stmts.db")
    conn.execute("begin")
    _seed(conn.execute)
    conn.execute("commit")
    for op, path in statement_files("sqlite").items():
        overrides, expected = _STATEMENT_CASES[op]
        expected = _SQLITE_COUNTS.get(op, expected)
        params = {**_params("sqlite"), **overrides}
        conn.execute("begin")
        text = _filled(strip_comments(path.read_text()))
        values = _sqlite_values(text)
        try:
            if values is not None:
                head, _, row = text.strip().rstrip(";").rpartition("values")
                text = f"{head}values {row}, {row}"
                expected = None  # it returns nothing: the store knows the rows it wrote
            cur = conn.execute(text, params if values is None else values)
            rows = cur.fetchall() if cur.description else None
        except sqlite3.Error as exc:
            raise AssertionError(f"sqlite {op}: {exc}") from exc
        finally:
            conn.execute("rollback")
        _check_count(op, rows, expected)


def test_postgres_statements_execute(pg: PgDatabases) -> None:
    name = pg_ours(pg, "stmts")
    with pg.connect(name) as conn:
        with conn.transaction():
            _seed(lambda sql, p: conn.execute(to_psycopg(sql), p))
        for op, path in statement_files("postgres").items():
            overrides, expected = _STATEMENT_CASES[op]
            params = {**_params("postgres"), **overrides}
            text = to_psycopg(_filled(path.read_text()))
            try:
                if normalize(text).startswith("copy "):
                    rows = None
                    with conn.cursor().copy(strip_comments(text)) as copy:
                        copy.write_row(_copy_row())
                    stored = conn.execute("select * from cairnq_tasks where id = 'task_copied'")
                    assert stored.fetchone() is not None
                else:
                    cur = conn.execute(text, params)
                    rows = cur.fetchall() if cur.description else None
            except Exception as exc:
                raise AssertionError(f"postgres {op}: {exc}") from exc
            finally:
                conn.rollback()
            _check_count(op, rows, expected)
            if op == "sql/installations":
                assert rows == [{"current_schema": "public", "schema": "public"}]


def test_statements_name_only_known_parameters() -> None:
    known = set(_params("sqlite"))
    for dialect in DIALECTS:
        for op, path in statement_files(dialect).items():
            used = set(PARAM.findall(strip_comments(path.read_text())))
            assert used <= known, (dialect, op, used - known)
            text = normalize(path.read_text())
            if text.startswith("do $$"):  # one statement: a plpgsql block
                continue
            assert text.count(";") <= 1 and not text.rstrip(";").count(";"), (dialect, op)


def test_statement_conventions() -> None:
    for dialect in DIALECTS:
        sql = {op: normalize(p.read_text()) for op, p in statement_files(dialect).items()}
        # Partial index predicates, verbatim.
        lease = "status = 'running' and lease_until_ms is not null"
        for op in ("sql/recover_leases", "sql/claimable_probe", "extensions/leases_expired"):
            assert lease in sql[op], (dialect, op)
        assert "status in ('succeeded', 'failed', 'canceled')" in sql["sql/purge"]
        assert "completed_at_ms is not null" in sql["sql/purge"]
        # Optional filters. Postgres types the first use (an absent filter binds NULL, and
        # "$1 is null" alone does not tell Postgres the parameter's type).
        cast = "::text" if dialect == "postgres" else ""
        for op, cols in (
            ("sql/list", ("status", "queue", "name", "root_id", "correlation_id")),
            ("sql/purge", ("queue", "status", "name")),
            ("sql/stats", ("queue",)),
        ):
            for col in cols:
                assert f"(:{col}{cast} is null or {col} = :{col})" in sql[op], (dialect, op)
        assert "order by created_at_ms desc, id desc limit :limit offset :offset" in sql["sql/list"]
        for op in ("claim", "claim_one_queue", "claim_one_name", "claim_one_queue_one_name"):
            assert "order by priority desc, run_at_ms asc, id asc" in sql[f"sql/{op}"]
        if dialect == "postgres":
            for op in ("purge", "recover_leases", "claim"):
                assert "for update skip locked" in sql[f"sql/{op}"], op
            assert "order by" not in sql["sql/recover_leases"]
            assert "pg_advisory_xact_lock(hashtextextended(:key::text, 0))" in sql["sql/lock_key"]
            for op in ("heartbeat", "heartbeat_batch", "progress", "complete", "succeed", "fail"):
                assert "status = :running" in sql[f"sql/{op}"], op
                assert "'running'" not in sql[f"sql/{op}"], op
            clock = "(select (extract(epoch from clock_timestamp()) * 1000)::bigint)"
            assert sql["sql/claimable_probe"].count(clock) == 2
        else:
            assert "completed_at_ms < :before_ms" in sql["sql/purge"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_loader_specializes_optional_filters(dialect: str) -> None:
    """The store's loader turns every supplied filter into a plain equality."""
    from cairnqd._protocol import raw_sql, specialize

    for op, filters in (
        ("list", ("status", "queue", "name", "root_id", "correlation_id")),
        ("purge", ("queue", "status", "name")),
        ("stats", ("queue",)),
    ):
        text = specialize(raw_sql(dialect, op), frozenset(filters))  # type: ignore[arg-type]
        assert " is null or " not in text, (dialect, op)
        for col in filters:
            assert f"{col} = :{col}" in text, (dialect, op, col)


# -- claim variants ------------------------------------------------------------------

_CLAIM_PREDICATES = {
    "sqlite": {
        "queues": "queue in (select value from json_each(:queues))",
        "queue": "queue = :queue",
        "names": "(:names is null or name in (select value from json_each(:names)))",
        "name": "name = :name",
    },
    "postgres": {
        "queues": "queue = any(:queues::text[])",
        "queue": "queue = :queue",
        "names": "(:names::text[] is null or name = any(:names::text[]))",
        "name": "name = :name",
    },
}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_claim_variants_differ_only_in_predicates(dialect: str) -> None:
    pred = _CLAIM_PREDICATES[dialect]
    base = normalize(statement_text(dialect, "claim"))
    assert base.count(pred["queues"]) == 1 and base.count(pred["names"]) == 1
    variants = {
        "claim_one_queue": [("queues", "queue")],
        "claim_one_name": [("names", "name")],
        "claim_one_queue_one_name": [("queues", "queue"), ("names", "name")],
    }
    for variant, swaps in variants.items():
        expected = base
        for general, special in swaps:
            expected = expected.replace(pred[general], pred[special])
        assert normalize(statement_text(dialect, variant)) == expected, variant
