"""The SQLite migration runner: one `BEGIN IMMEDIATE` transaction per migration, in
which the ledger is checked and, if the name is absent, the file runs and is recorded."""

from __future__ import annotations

import sqlite3
import time

from cairnqd._protocol import Migration, migrations, strip_comments
from cairnqd.store.migrate import LEDGER_TABLES, ledger_sql, pending


def pending_sqlite(conn: sqlite3.Connection) -> list[str]:
    """Known migrations missing from the ledgers, without writing anything."""
    applied: dict[str, set[str]] = {}
    for ledger, table in LEDGER_TABLES.items():
        exists = conn.execute(
            ledger_sql("sqlite", "cairnq", "ledger_exists"), {"table_name": table}
        ).fetchone()
        applied[ledger] = set()
        if exists and exists[0]:
            rows = conn.execute(ledger_sql("sqlite", ledger, "ledger_names")).fetchall()
            applied[ledger] = {r[0] for r in rows}
    return pending(applied, "sqlite")


def split_sqlite_script(sql: str) -> list[str]:
    """Split a migration into statements without executescript, which would COMMIT
    the surrounding transaction before running anything."""
    statements: list[str] = []
    pending = ""
    for line in sql.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            text = strip_comments(pending).strip()
            if text.strip(";").strip():
                statements.append(text)
            pending = ""
    if strip_comments(pending).strip():
        raise ValueError(f"unterminated statement at the end of a migration: {pending!r}")
    return statements


def apply_sqlite(conn: sqlite3.Connection) -> list[str]:
    """Apply missing migrations on an autocommit connection whose busy_timeout is set.

    Blocking; the SQLite store runs it on a worker thread during connect.
    Returns the names applied by this call.
    """
    applied: list[str] = []
    for ledger in ("cairnq", "cairnqd"):
        conn.execute(ledger_sql("sqlite", ledger, "ledger_create"))
    for migration in migrations("sqlite"):
        conn.execute("BEGIN IMMEDIATE")
        try:
            if _sqlite_needs(conn, migration):
                for stmt in split_sqlite_script(migration.sql):
                    conn.execute(stmt)
                conn.execute(
                    ledger_sql("sqlite", migration.ledger, "ledger_record"),
                    {"name": migration.name, "now_ms": int(time.time() * 1000)},
                )
                applied.append(migration.name)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return applied


def _sqlite_needs(conn: sqlite3.Connection, migration: Migration) -> bool:
    found = conn.execute(
        ledger_sql("sqlite", migration.ledger, "ledger_applied"), {"name": migration.name}
    ).fetchone()
    return found is None
