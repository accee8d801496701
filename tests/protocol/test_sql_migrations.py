"""The migration files themselves: re-runnable, cleanly split, and meta writes as upstream's.

A runner that lost its ledger replays every file; the schema and meta rows must come out
the same, and the data backfill must only repair what needs repairing.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.protocol.sqldb import (
    PgDatabases,
    pg_apply,
    pg_meta,
    pg_ours,
    pg_schema,
    sqlite_apply,
    sqlite_meta,
    sqlite_ours,
    sqlite_schema,
)
from tests.protocol.sqlfiles import (
    DIALECTS,
    ROOT,
    extension_migration_files,
    migration_files,
    normalize,
    split_sqlite,
)


def test_sqlite_migrations_rerun(tmp_path: Path) -> None:
    conn = sqlite_ours(tmp_path / "twice.db")
    before = sqlite_schema(conn, skip_prefix=None)
    # Replay every file outside the ledger, as a runner that lost its ledger would.
    sqlite_apply(conn, migration_files("sqlite") + extension_migration_files("sqlite"), None)
    assert sqlite_schema(conn, skip_prefix=None) == before
    assert sqlite_meta(conn) == [("protocol_version", "1"), ("schema_version", "10")]
    # The data backfill is a no-op on clean rows and repairs a stale terminal lease.
    now = int(time.time() * 1000)
    conn.execute(
        "insert into cairnq_tasks (id, name, status, payload, lease_until_ms, run_at_ms, "
        "created_at_ms, updated_at_ms) values ('t', 'n', 'succeeded', '{}', ?, ?, ?, ?)",
        (now + 1000, now, now, now),
    )
    sqlite_apply(conn, [ROOT / "migrations/sqlite/0005_clear_terminal_lease.sql"], None)
    assert conn.execute("select lease_until_ms from cairnq_tasks").fetchone()[0] is None


def test_postgres_migrations_rerun(pg: PgDatabases) -> None:
    name = pg_ours(pg, "rerun")
    with pg.connect(name) as conn:
        before = pg_schema(conn, skip_prefix=None)
        pg_apply(conn, migration_files("postgres") + extension_migration_files("postgres"), None)
        assert pg_schema(conn, skip_prefix=None) == before
        assert pg_meta(conn) == [("protocol_version", "1"), ("schema_version", "10")]


def test_sqlite_migration_files_split_cleanly() -> None:
    for path in migration_files("sqlite"):
        text = path.read_text()
        assert "begin" not in normalize(text).split(), f"{path.name}: no BEGIN..END in SQLite"
        assert split_sqlite(text), path.name
    # Our own files may hold triggers (only our runner reads them): each trigger, BEGIN
    # to END, comes out as one statement.
    for path in extension_migration_files("sqlite"):
        statements = split_sqlite(path.read_text())
        assert statements, path.name
        for stmt in statements:
            words = normalize(stmt).split()
            if "begin" in words:
                assert words[:2] == ["create", "trigger"], (path.name, stmt)
                assert words[-1] == "end;", (path.name, stmt)


def test_meta_writes_follow_upstream() -> None:
    """0001 inserts, later files update to their ordinal, 0003 writes nothing."""
    for dialect in DIALECTS:
        for path in migration_files(dialect):
            text = normalize(path.read_text())
            ordinal = int(path.name[:4])
            if ordinal == 1:
                assert "on conflict (key) do nothing" in text
            elif ordinal == 3:
                assert "cairnq_meta" not in text
            else:
                assert (
                    f"update cairnq_meta set value = '{ordinal}' where key = 'schema_version'"
                    in text
                )
        for path in extension_migration_files(dialect):
            assert "cairnq_meta" not in normalize(path.read_text())
