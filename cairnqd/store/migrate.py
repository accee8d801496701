"""The migration runner: ledger-driven, one write transaction per migration.

Every connect walks all known migrations in order. Each gets its own write
transaction (SQLite `BEGIN IMMEDIATE`; Postgres an exclusive lock on the ledger table)
inside which the ledger is checked and, if the name is absent, the file runs and its
name is recorded. N processes cold-starting at once therefore serialize on the lock,
and every loser re-checks inside it and skips: each migration applies exactly once.

Two ledgers: upstream's `cairnq_migrations` for the shared files (same names as the
public SDKs, so each side sees the other's database as fully migrated) and
`cairnqd_migrations` for our own objects, so upstream's future file names can never
collide with ours. Unknown rows in either ledger are left alone (a newer SDK wrote them).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cairnqd._protocol import Migration, migrations, protocol_root, strip_comments
from cairnqd.errors import ProtocolVersionMismatch

if TYPE_CHECKING:  # only the Postgres store, which has imported it, calls those functions
    import psycopg

#: The storage protocol this code speaks: the `protocol_version` row its migrations
#: leave in the database, the same for SQLite and Postgres.
STORAGE_PROTOCOL_VERSION = 1


def check_protocol_version(found: int, where: str) -> None:
    """Refuse a database whose `protocol_version` row (`found`, 0 when absent) is not
    the one this code speaks; `where` names the database for the error."""
    if found != STORAGE_PROTOCOL_VERSION:
        raise ProtocolVersionMismatch(
            f"{where}: storage protocol_version={found}, "
            f"cairnqd supports {STORAGE_PROTOCOL_VERSION}"
        )


_LEDGER_FOLDER = {"cairnq": "sql", "cairnqd": "extensions/sql"}


def _ledger_sql(dialect: str, ledger: str, op: str) -> str:
    path = protocol_root() / _LEDGER_FOLDER[ledger] / dialect / f"{op}.sql"
    return strip_comments(Path(path).read_text(encoding="utf-8")).strip()


_LEDGER_TABLE = {"cairnq": "cairnq_migrations", "cairnqd": "cairnqd_migrations"}


def _pending(applied: dict[str, set[str]], dialect: str) -> list[str]:
    return [m.name for m in migrations(dialect) if m.name not in applied[m.ledger]]  # type: ignore[arg-type]


def pending_sqlite(conn: sqlite3.Connection) -> list[str]:
    """Known migrations missing from the ledgers, without writing anything."""
    applied: dict[str, set[str]] = {}
    for ledger, table in _LEDGER_TABLE.items():
        exists = conn.execute(
            _ledger_sql("sqlite", "cairnq", "ledger_exists"), {"table_name": table}
        ).fetchone()
        applied[ledger] = set()
        if exists and exists[0]:
            rows = conn.execute(_ledger_sql("sqlite", ledger, "ledger_names")).fetchall()
            applied[ledger] = {r[0] for r in rows}
    return _pending(applied, "sqlite")


async def pending_postgres(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    applied: dict[str, set[str]] = {}
    for ledger, table in _LEDGER_TABLE.items():
        cur = await conn.execute(
            _pg_named(_ledger_sql("postgres", "cairnq", "ledger_exists")), {"table_name": table}
        )
        row = await cur.fetchone()
        present = bool(row and (row["n"] if isinstance(row, dict) else row[0]))
        names: set[str] = set()
        if present:
            cur = await conn.execute(_ledger_sql("postgres", ledger, "ledger_names"))
            names = {r["name"] if isinstance(r, dict) else r[0] for r in await cur.fetchall()}
        applied[ledger] = names
    return _pending(applied, "postgres")


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
        conn.execute(_ledger_sql("sqlite", ledger, "ledger_create"))
    for migration in migrations("sqlite"):
        conn.execute("BEGIN IMMEDIATE")
        try:
            if _sqlite_needs(conn, migration):
                for stmt in split_sqlite_script(migration.sql):
                    conn.execute(stmt)
                conn.execute(
                    _ledger_sql("sqlite", migration.ledger, "ledger_record"),
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
        _ledger_sql("sqlite", migration.ledger, "ledger_applied"), {"name": migration.name}
    ).fetchone()
    return found is None


async def apply_postgres(conn: psycopg.AsyncConnection[object]) -> list[str]:
    """Apply missing migrations on Postgres, one locked transaction each."""
    applied: list[str] = []
    for ledger in ("cairnq", "cairnqd"):
        await conn.execute(_ledger_sql("postgres", ledger, "ledger_create"))
    for migration in migrations("postgres"):
        async with conn.transaction():
            await conn.execute(_ledger_sql("postgres", migration.ledger, "ledger_lock"))
            cur = await conn.execute(
                _pg_named(_ledger_sql("postgres", migration.ledger, "ledger_applied")),
                {"name": migration.name},
            )
            if await cur.fetchone() is not None:
                continue
            # Without parameters psycopg uses the simple query protocol, so a file
            # may hold many statements (and `%` needs no escaping).
            await conn.execute(migration.sql)
            await conn.execute(
                _pg_named(_ledger_sql("postgres", migration.ledger, "ledger_record")),
                {"name": migration.name},
            )
            applied.append(migration.name)
    return applied


def _pg_named(sql: str) -> str:
    from cairnqd._protocol import _to_psycopg

    return _to_psycopg(sql)
