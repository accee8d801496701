"""The SQLite side of `cairnqd move-to`: the source file read in primary-key order,
and the running tasks settled on a scratch copy by the protocol's own lease recovery.

The file is opened read-only (`mode=ro`): a move never writes to its source (the
pauses of `--live` go through the ordinary store, not through this module).
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cairnqd._protocol import statement
from cairnqd.errors import NotACairnqDatabase
from cairnqd.store.sqlite.migrate import apply_sqlite, pending_sqlite

Row = tuple[Any, ...]


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SqliteMoveSource:
    """One SQLite database file, read for a move."""

    def __init__(self, path: str) -> None:
        self.path = str(Path(path).expanduser().resolve())
        if not Path(self.path).is_file():
            raise FileNotFoundError(f"no SQLite database at {self.path}")
        uri = f"file:{urllib.parse.quote(self.path)}?mode=ro"
        self._conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        self._conn.execute("pragma busy_timeout = 5000")
        self._columns: dict[str, list[str]] = {}
        self._keys: dict[str, list[str]] = {}

    def close(self) -> None:
        self._conn.close()

    def check(self) -> tuple[int, list[str]]:
        """The file's protocol version and the migrations it lacks; NotACairnqDatabase
        when it is not a cairnq database at all."""
        try:
            row = self._conn.execute(
                "select value from cairnq_meta where key = 'protocol_version'"
            ).fetchone()
            pending = pending_sqlite(self._conn)
        except sqlite3.DatabaseError as exc:
            raise NotACairnqDatabase(f"{self.path}: not a cairnq database ({exc})") from None
        return (int(row[0]) if row else 0), pending

    def tables(self) -> list[str]:
        """Every table of the file, SQLite's own left out."""
        rows = self._conn.execute(
            "select name from sqlite_schema where type = 'table' "
            "and name not like 'sqlite\\_%' escape '\\' order by name"
        ).fetchall()
        return [r[0] for r in rows]

    def columns(self, table: str) -> list[str]:
        if table not in self._columns:
            self._describe(table)
        return self._columns[table]

    def primary_key(self, table: str) -> list[str]:
        if table not in self._keys:
            self._describe(table)
        return self._keys[table]

    def _describe(self, table: str) -> None:
        info = self._conn.execute(f"pragma table_info({_quoted(table)})").fetchall()
        if not info:
            raise ValueError(f"{self.path}: no table {table}")
        self._columns[table] = [r[1] for r in info]
        keyed = sorted((r[5], r[1]) for r in info if r[5] > 0)
        if not keyed:
            raise ValueError(f"{self.path}: table {table} has no primary key to move it by")
        self._keys[table] = [name for _, name in keyed]

    def count(self, table: str) -> int:
        row = self._conn.execute(f"select count(*) from {_quoted(table)}").fetchone()
        return int(row[0])

    def batch(self, table: str, after: Sequence[Any] | None, limit: int) -> list[Row]:
        """Up to `limit` rows of `table` (all its columns) after the key `after`, in
        primary-key order (SQLite's binary order of the key's values)."""
        cols = ", ".join(_quoted(c) for c in self.columns(table))
        key = self.primary_key(table)
        order = ", ".join(_quoted(c) for c in key)
        sql = f"select {cols} from {_quoted(table)}"
        params: list[Any] = []
        if after is not None:
            marks = ", ".join("?" for _ in key)
            sql += f" where ({order}) > ({marks})"
            params.extend(after)
        sql += f" order by {order} limit {int(limit)}"
        return list(self._conn.execute(sql, params).fetchall())

    def group_counts(self) -> dict[tuple[str, str], int]:
        rows = self._conn.execute(
            "select queue, status, count(*) from cairnq_tasks group by queue, status"
        ).fetchall()
        return {(r[0], r[1]): int(r[2]) for r in rows}

    def live_daemons(self, now_ms: int, live_ms: int) -> list[tuple[str, str, int]]:
        """(daemon, host, pid) of each daemon live in the file's fleet registry, read
        with the registry's own statement."""
        members = statement("sqlite", "extensions/fleet_members")
        rows = self._conn.execute(
            members.text, {"now_ms": now_ms, "since_ms": live_ms, "live_ms": live_ms}
        ).fetchall()
        return [(r[0], r[1], int(r[2])) for r in rows if r[-1]]

    def running(self) -> tuple[list[Row], list[Row]]:
        """The running tasks (all columns) and their open attempt records."""
        task_cols = ", ".join(_quoted(c) for c in self.columns("cairnq_tasks"))
        tasks = self._conn.execute(
            f"select {task_cols} from cairnq_tasks where status = 'running'"
        ).fetchall()
        attempt_cols = ", ".join(_quoted(c) for c in self.columns("cairnqd_attempts"))
        attempts = self._conn.execute(
            f"select {attempt_cols} from cairnqd_attempts as a "
            "where a.finished_at_ms is null and exists (select 1 from cairnq_tasks as t "
            "where t.id = a.task_id and t.status = 'running')"
        ).fetchall()
        return list(tasks), list(attempts)


def settle_running(
    task_columns: Sequence[str],
    tasks: Sequence[Row],
    attempt_columns: Sequence[str],
    attempts: Sequence[Row],
    *,
    now_ms: int,
    error_json: str,
) -> tuple[list[Row], list[Row]]:
    """`tasks` (running) and their open `attempts` as the lease reaper would leave them
    at `now_ms` once their leases had run out: the protocol's `recover_leases` and the
    attempt history's triggers run on a scratch in-memory database, so the rule is
    theirs, not a copy of it. Every lease is first taken as ended at `now_ms`."""
    scratch = sqlite3.connect(":memory:", isolation_level=None)
    try:
        apply_sqlite(scratch)
        for table, columns, rows in (
            ("cairnq_tasks", task_columns, tasks),
            ("cairnqd_attempts", attempt_columns, attempts),
        ):
            if rows:
                names = ", ".join(_quoted(c) for c in columns)
                marks = ", ".join("?" for _ in columns)
                scratch.executemany(f"insert into {table} ({names}) values ({marks})", rows)
        scratch.execute(
            "update cairnq_tasks set lease_until_ms = ? where status = 'running' "
            "and (lease_until_ms is null or lease_until_ms > ?)",
            (now_ms, now_ms),
        )
        recover = statement("sqlite", "recover_leases")
        scratch.execute(recover.text, {"now_ms": now_ms, "error": error_json}).fetchall()
        names = ", ".join(_quoted(c) for c in task_columns)
        settled = scratch.execute(f"select {names} from cairnq_tasks").fetchall()
        names = ", ".join(_quoted(c) for c in attempt_columns)
        closed = scratch.execute(f"select {names} from cairnqd_attempts").fetchall()
        return list(settled), list(closed)
    finally:
        scratch.close()
