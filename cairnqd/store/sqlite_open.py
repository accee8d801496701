"""Opening a SQLite file the protocol's way: WAL, foreign keys, migrations, planner
statistics and the protocol guard, in that order, on a connection nothing else sees yet.

Blocking: the store runs `open_database` on a thread, because a cold start may wait
on another process's migration and that wait must not stall the event loop.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from cairnqd._protocol import statement
from cairnqd.errors import MigrationsPending, NotACairnqDatabase, ProtocolVersionMismatch
from cairnqd.store.errors import is_sqlite_busy
from cairnqd.store.migrate import apply_sqlite, pending_sqlite

_WAL_RETRY_S = 0.05


def is_memory(path: str) -> bool:
    return path == ":memory:" or "mode=memory" in path


def open_database(
    path: str, *, busy_timeout_ms: int, synchronous: str, migrate: bool
) -> sqlite3.Connection:
    """A connection ready for the store: migrated (or refused when `migrate` is off
    and migrations are pending), speaking protocol 1, busy_timeout back at 0."""
    memory = is_memory(path)
    if not memory:
        Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(
        path,
        isolation_level=None,
        check_same_thread=False,
        uri=path.startswith("file:"),
        cached_statements=256,
    )
    try:
        conn.execute(f"pragma busy_timeout = {int(busy_timeout_ms)}")
        if not memory:
            _enable_wal(conn, path, busy_timeout_ms)
        conn.execute("pragma foreign_keys = on")
        conn.execute(f"pragma synchronous = {synchronous}")
        if migrate:
            apply_sqlite(conn)
        elif pending := pending_sqlite(conn):
            raise MigrationsPending(path, pending)
        refresh_statistics(conn)
        _check_protocol(conn, path)
        # From here on the store retries SQLITE_BUSY itself, awaiting between tries.
        conn.execute("pragma busy_timeout = 0")
    except sqlite3.DatabaseError as exc:
        conn.close()
        if not _looks_foreign(exc):
            raise
        raise NotACairnqDatabase(f"{path} is not a SQLite database cairnqd can use: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _enable_wal(conn: sqlite3.Connection, path: str, busy_timeout_ms: int) -> None:
    # Switching to WAL answers SQLITE_BUSY at once instead of honouring busy_timeout
    # while another process holds the file, so retry it.
    deadline = time.monotonic() + max(busy_timeout_ms, 1) / 1000
    while True:
        try:
            mode = conn.execute("pragma journal_mode = wal").fetchone()
            if mode and str(mode[0]).lower() == "wal":
                return
            raise NotACairnqDatabase(f"{path}: cannot switch to WAL (got {mode})")
        except sqlite3.OperationalError as exc:
            if not is_sqlite_busy(exc) or time.monotonic() > deadline:
                raise
            time.sleep(_WAL_RETRY_S)


def refresh_statistics(conn: sqlite3.Connection) -> None:
    """Without statistics the planner guesses half the table is `running` and skips
    the partial lease index; before 3.46 `pragma optimize` never creates the first
    statistics, so bootstrap them with an explicit ANALYZE."""
    try:
        has_stats = (
            conn.execute("select 1 from sqlite_master where name = 'sqlite_stat1'").fetchone()
            and conn.execute(
                "select 1 from sqlite_stat1 where tbl = 'cairnq_tasks' limit 1"
            ).fetchone()
        )
        conn.execute("pragma optimize" if has_stats else "analyze cairnq_tasks")
    except sqlite3.OperationalError:
        pass  # best effort: busy or read-only; plans are still correct, just slower


def _check_protocol(conn: sqlite3.Connection, path: str) -> None:
    row = conn.execute(statement("sqlite", "protocol_version").text).fetchone()
    version = int(row[0]) if row else 0
    if version != 1:
        raise ProtocolVersionMismatch(
            f"{path}: storage protocol_version={version}, cairnqd supports 1"
        )


def _looks_foreign(exc: sqlite3.DatabaseError) -> bool:
    text = str(exc).lower()
    return "not a database" in text or "file is encrypted" in text


__all__ = ["is_memory", "open_database", "refresh_statistics"]
