"""The Postgres side of `cairnqd move-to`: the target migrated with the ordinary
runner, each batch written with COPY in one transaction together with its progress row
(`cairnqd_moves`), and the rows read back by key for the verification.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from cairnqd.config.dsn import redact_dsn
from cairnqd.errors import CairnQError, DatabaseUnavailable
from cairnqd.store.postgres.migrate import apply_postgres

Row = tuple[Any, ...]

#: The move's progress table (migration cairnqd_0014_moves.sql).
PROGRESS_TABLE = "cairnqd_moves"
#: The first key of a move's advisory lock (the second: a hash of its source's path);
#: the daemon's namespace holds the others.
_MOVE_LOCK = 0x63716D76


class RowsAlreadyThere(CairnQError):
    """A batch holds a row whose key the target already has."""


@dataclass(frozen=True)
class Progress:
    """How far a move of one table has come."""

    table: str
    last_key: list[Any] | None
    moved: int
    skipped: int
    started_at_ms: int
    finished_at_ms: int | None


class PostgresMoveTarget:
    """One Postgres database, written by a move over one autocommit connection."""

    def __init__(self, dsn: str, *, connect_timeout_s: float = 10.0) -> None:
        self.dsn = dsn
        self.where = redact_dsn(dsn)
        self._timeout = max(1, round(connect_timeout_s))
        try:
            self._conn = psycopg.connect(dsn, autocommit=True, connect_timeout=self._timeout)
        except psycopg.Error as exc:
            message = " ".join(str(exc).split())
            raise DatabaseUnavailable(
                f"cannot connect to Postgres at {self.where}: {message}"
            ) from None
        self._types: dict[str, dict[str, str]] = {}

    def close(self) -> None:
        self._conn.close()

    # -- what is there ---------------------------------------------------------------

    def has_table(self, table: str) -> bool:
        row = self._conn.execute("select to_regclass(%s) is not null", (table,)).fetchone()
        return bool(row and row[0])

    def protocol_version(self) -> int | None:
        """The `protocol_version` row; None on a database that has no cairnq tables yet."""
        if not self.has_table("cairnq_meta"):
            return None
        row = self._conn.execute(
            "select value from cairnq_meta where key = 'protocol_version'"
        ).fetchone()
        return int(row[0]) if row else 0

    def count(self, table: str) -> int:
        if not self.has_table(table):
            return 0
        row = self._conn.execute(
            sql.SQL("select count(*) from {}").format(sql.Identifier(table))
        ).fetchone()
        return int(row[0]) if row else 0

    def column_types(self, table: str) -> dict[str, str]:
        """Each column of `table` and its SQL type, as `format_type` writes it."""
        if table not in self._types:
            rows = self._conn.execute(
                "select a.attname, format_type(a.atttypid, a.atttypmod) from pg_attribute a "
                "where a.attrelid = to_regclass(%s) and a.attnum > 0 and not a.attisdropped "
                "order by a.attnum",
                (table,),
            ).fetchall()
            self._types[table] = {r[0]: r[1] for r in rows}
        return self._types[table]

    def group_counts(self) -> dict[tuple[str, str], int]:
        rows = self._conn.execute(
            "select queue, status, count(*) from cairnq_tasks group by queue, status"
        ).fetchall()
        return {(r[0], r[1]): int(r[2]) for r in rows}

    # -- migrating -------------------------------------------------------------------

    def migrate(self) -> list[str]:
        """The ordinary migration runner on a connection of its own; the names applied."""

        async def run() -> list[str]:
            async with await psycopg.AsyncConnection.connect(
                self.dsn, autocommit=True, connect_timeout=self._timeout
            ) as conn:
                return await apply_postgres(conn)

        applied = asyncio.run(run())
        self._types.clear()
        return applied

    # -- progress --------------------------------------------------------------------

    def progress(self, source: str) -> dict[str, Progress]:
        if not self.has_table(PROGRESS_TABLE):
            return {}
        rows = self._conn.execute(
            "select table_name, last_key, moved, skipped, started_at_ms, finished_at_ms "
            "from cairnqd_moves where source = %s",
            (source,),
        ).fetchall()
        return {
            r[0]: Progress(
                table=r[0],
                last_key=json.loads(r[1]) if r[1] is not None else None,
                moved=int(r[2]),
                skipped=int(r[3]),
                started_at_ms=int(r[4]),
                finished_at_ms=None if r[5] is None else int(r[5]),
            )
            for r in rows
        }

    def lock(self, source: str) -> bool:
        """Take the session lock of moves from `source` into this database; False when
        another process holds it (two runs of one move would write the same rows)."""
        row = self._conn.execute(
            "select pg_try_advisory_lock(%s::integer, hashtext(%s))", (_MOVE_LOCK, source)
        ).fetchone()
        return bool(row and row[0])

    def begin(self, source: str, tables: Sequence[str], now_ms: int) -> None:
        """A progress row for every table of the move (kept as they are on a re-run)."""
        with self._conn.transaction():
            for table in tables:
                self._conn.execute(
                    "insert into cairnqd_moves (source, table_name, started_at_ms, "
                    "updated_at_ms) values (%s, %s, %s, %s) "
                    "on conflict (source, table_name) do nothing",
                    (source, table, now_ms, now_ms),
                )

    def finish(self, source: str, table: str, now_ms: int) -> None:
        self._conn.execute(
            "update cairnqd_moves set finished_at_ms = %s, updated_at_ms = %s "
            "where source = %s and table_name = %s",
            (now_ms, now_ms, source, table),
        )

    # -- writing ---------------------------------------------------------------------

    def write(
        self,
        source: str,
        table: str,
        columns: Sequence[str],
        rows: Sequence[Row],
        *,
        last_key: Sequence[Any],
        skipped: int,
        now_ms: int,
    ) -> None:
        """COPY `rows` into `table` and advance its progress to `last_key`, in one
        transaction: either both land or neither does."""
        copy = sql.SQL("copy {} ({}) from stdin").format(
            sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        )
        try:
            self._write(copy, rows, source, table, last_key, skipped, now_ms)
        except psycopg.errors.UniqueViolation as exc:
            detail = exc.diag.message_detail or str(exc)
            raise RowsAlreadyThere(f"{table}: {' '.join(detail.split())}") from None

    def _write(
        self,
        copy: sql.Composed,
        rows: Sequence[Row],
        source: str,
        table: str,
        last_key: Sequence[Any],
        skipped: int,
        now_ms: int,
    ) -> None:
        with self._conn.transaction():
            if rows:
                with self._conn.cursor() as cur, cur.copy(copy) as writer:
                    for row in rows:
                        writer.write_row(row)
            self._conn.execute(
                "update cairnqd_moves set last_key = %s, moved = moved + %s, "
                "skipped = skipped + %s, updated_at_ms = %s "
                "where source = %s and table_name = %s",
                (json.dumps(list(last_key)), len(rows), skipped, now_ms, source, table),
            )

    # -- reading back ----------------------------------------------------------------

    def by_keys(
        self, table: str, columns: Sequence[str], key: Sequence[str], keys: Sequence[Row]
    ) -> dict[Row, Row]:
        """The rows of `table` whose primary key (`key`'s columns) is among `keys`,
        by key. Keys are passed as one array per column and matched with `unnest`."""
        if not keys:
            return {}
        types = self.column_types(table)
        wanted = [c for c in columns if c not in key]
        select = [*key, *wanted]
        arrays = sql.SQL(", ").join(sql.SQL("%s::{}[]").format(sql.SQL(types[c])) for c in key)
        query = sql.SQL("select {} from {} where ({}) in (select * from unnest({}))").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in select),
            sql.Identifier(table),
            sql.SQL(", ").join(sql.Identifier(c) for c in key),
            arrays,
        )
        params = [[k[i] for k in keys] for i in range(len(key))]
        found: dict[Row, Row] = {}
        index = {c: i for i, c in enumerate(select)}
        for r in self._conn.execute(query, params).fetchall():
            found[tuple(r[: len(key)])] = tuple(r[index[c]] for c in columns)
        return found
