"""Migrated throwaway databases for the protocol tests, and their schema as plain data.

Migrations are applied by a small local runner (one transaction per file, a ledger row
per file) so the files are tested, not the store's migrator. The schema readers turn
everything SQLite or Postgres can say about a schema into comparable dicts and lists.
"""

from __future__ import annotations

import os
import re
import secrets
import sqlite3
import time
import urllib.parse
from pathlib import Path
from typing import Any

from tests.protocol.sqlfiles import (
    ROOT,
    extension_migration_files,
    migration_files,
    split_sqlite,
    strip_comments,
    to_psycopg,
)

# -- SQLite ---------------------------------------------------------------------------


def sqlite_connect(path: Path | str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("pragma foreign_keys = on")
    return conn


def sqlite_apply(conn: sqlite3.Connection, files: list[Path], ledger: str | None) -> None:
    """One BEGIN IMMEDIATE per file; record the file in `ledger` ("cairnq"/"cairnqd")."""
    folder = {"cairnq": ROOT / "sql", "cairnqd": ROOT / "extensions" / "sql"}
    if ledger:
        conn.execute((folder[ledger] / "sqlite" / "ledger_create.sql").read_text())
    for path in files:
        conn.execute("begin immediate")
        try:
            for stmt in split_sqlite(path.read_text(encoding="utf-8")):
                conn.execute(stmt)
            if ledger:
                conn.execute(
                    (folder[ledger] / "sqlite" / "ledger_record.sql").read_text(),
                    {"name": path.name, "now_ms": int(time.time() * 1000)},
                )
            conn.execute("commit")
        except BaseException:
            conn.execute("rollback")
            raise


def sqlite_ours(path: Path, *, extensions: bool = True) -> sqlite3.Connection:
    conn = sqlite_connect(path)
    sqlite_apply(conn, migration_files("sqlite"), "cairnq")
    if extensions:
        sqlite_apply(conn, extension_migration_files("sqlite"), "cairnqd")
    return conn


def _balanced(text: str, start: int) -> str:
    """The text inside the parenthesis opening at `start`, quotes respected."""
    depth, i, quote = 0, start, None
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
        i += 1
    raise AssertionError(f"unbalanced parenthesis in {text!r}")


def _tight(expr: str) -> str:
    return re.sub(r"\s+", "", expr).lower()


def sqlite_checks(create_sql: str) -> list[str]:
    return sorted(
        _tight(_balanced(create_sql, m.end() - 1))
        for m in re.finditer(r"\bcheck\s*\(", create_sql, re.I)
    )


def sqlite_schema(conn: sqlite3.Connection, *, skip_prefix: str | None = "cairnqd") -> dict:
    """Everything SQLite can tell about the schema, as comparable plain data."""
    objects = conn.execute(
        "select type, name, tbl_name, sql from sqlite_master "
        "where name not like 'sqlite_stat%' order by type, name"
    ).fetchall()
    schema: dict[str, Any] = {"tables": {}, "indexes": {}, "triggers": [], "views": []}
    for obj in objects:
        if skip_prefix and (
            obj["name"].startswith(skip_prefix) or obj["tbl_name"].startswith(skip_prefix)
        ):
            continue
        if obj["type"] == "table":
            name = obj["name"]
            schema["tables"][name] = {
                "columns": [
                    (r["cid"], r["name"], r["type"].lower(), r["notnull"], r["dflt_value"], r["pk"])
                    for r in conn.execute(f"pragma table_info('{name}')")
                ],
                "checks": sqlite_checks(obj["sql"]),
                "foreign_keys": [
                    tuple(r) for r in conn.execute(f"pragma foreign_key_list('{name}')")
                ],
                "index_list": sorted(
                    (r["name"], r["unique"], r["origin"], r["partial"])
                    for r in conn.execute(f"pragma index_list('{name}')")
                    if not (skip_prefix and r["name"].startswith(skip_prefix))
                ),
            }
        elif obj["type"] == "index":
            where = None
            if obj["sql"]:
                found = re.search(r"\bwhere\b(.*)$", obj["sql"], re.I | re.S)
                where = _tight(found.group(1)) if found else None
            schema["indexes"][obj["name"]] = {
                "table": obj["tbl_name"],
                "columns": [tuple(r) for r in conn.execute(f"pragma index_xinfo('{obj['name']}')")],
                "where": where,
            }
        elif obj["type"] == "trigger":
            schema["triggers"].append(obj["name"])
        else:
            schema["views"].append(obj["name"])
    return schema


def sqlite_meta(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    return [tuple(r) for r in conn.execute("select key, value from cairnq_meta order by key")]


def sqlite_ledger(conn: sqlite3.Connection, table: str = "cairnq_migrations") -> set[str]:
    return {r[0] for r in conn.execute(f"select name from {table}")}


# -- Postgres -------------------------------------------------------------------------

PG_DSN = os.environ.get("CAIRNQD_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def pg_url(dbname: str) -> str:
    """A URL DSN for `dbname` (asyncpg, used by the public SDK, takes URLs only)."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(PG_DSN)
    user = urllib.parse.quote(str(parts.get("user", "postgres")), safe="")
    password = parts.get("password")
    auth = user + (":" + urllib.parse.quote(str(password), safe="") if password else "")
    host = parts.get("host", "127.0.0.1")
    port = parts.get("port", 5432)
    return f"postgresql://{auth}@{host}:{port}/{dbname}"


class PgDatabases:
    """Throwaway databases for this module, dropped at the end."""

    def __init__(self) -> None:
        import psycopg

        self._psycopg = psycopg
        self.prefix = f"cairnqd_sqltest_{secrets.token_hex(4)}"
        self.created: list[str] = []
        self.admin = psycopg.connect(PG_DSN, autocommit=True, connect_timeout=3)

    def create(self, label: str) -> str:
        name = f"{self.prefix}_{label}"
        self.admin.execute(f'create database "{name}"')
        self.created.append(name)
        return name

    def connect(self, dbname: str, *, autocommit: bool = False) -> Any:
        from psycopg.rows import dict_row

        return self._psycopg.connect(pg_url(dbname), autocommit=autocommit, row_factory=dict_row)

    def close(self) -> None:
        for name in self.created:
            self.admin.execute(f'drop database if exists "{name}" with (force)')
        self.admin.close()


def pg_apply(conn: Any, files: list[Path], ledger: str | None) -> None:
    """One transaction per file, ledger locked first, like the runners."""
    folder = {"cairnq": ROOT / "sql", "cairnqd": ROOT / "extensions" / "sql"}
    if ledger:
        with conn.transaction():
            conn.execute(
                to_psycopg((folder[ledger] / "postgres" / "ledger_create.sql").read_text())
            )
    for path in files:
        text = path.read_text(encoding="utf-8")
        online = "concurrently" in strip_comments(text).lower()
        if online:
            # An index built concurrently runs outside a transaction, statement by
            # statement, as the runner does (cairnqd/store/postgres/migrate.py).
            conn.commit()
            conn.autocommit = True
            try:
                for statement in strip_comments(text).split(";"):
                    if statement.strip():
                        conn.execute(statement)
            finally:
                conn.autocommit = False
        with conn.transaction():
            if ledger:
                conn.execute(
                    to_psycopg((folder[ledger] / "postgres" / "ledger_lock.sql").read_text())
                )
            if not online:
                # No parameters: psycopg uses the simple protocol, so many statements work.
                conn.execute(text)
            if ledger:
                conn.execute(
                    to_psycopg((folder[ledger] / "postgres" / "ledger_record.sql").read_text()),
                    {"name": path.name},
                )


def pg_ours(pg: PgDatabases, label: str, *, extensions: bool = True) -> str:
    name = pg.create(label)
    with pg.connect(name) as conn:
        pg_apply(conn, migration_files("postgres"), "cairnq")
        if extensions:
            pg_apply(conn, extension_migration_files("postgres"), "cairnqd")
    return name


def pg_schema(conn: Any, *, skip_prefix: str | None = "cairnqd") -> dict:
    def keep(name: str) -> bool:
        return not (skip_prefix and name.startswith(skip_prefix))

    tables = [
        r["table_name"]
        for r in conn.execute(
            "select table_name from information_schema.tables "
            "where table_schema = 'public' order by table_name"
        )
    ]
    columns = [
        tuple(r.values())
        for r in conn.execute(
            "select table_name, ordinal_position, column_name, data_type, is_nullable, "
            "column_default from information_schema.columns where table_schema = 'public' "
            "order by table_name, ordinal_position"
        )
    ]
    constraints = sorted(
        tuple(r.values())
        for r in conn.execute(
            "select conrelid::regclass::text as tbl, conname, contype, "
            "pg_get_constraintdef(oid) as def from pg_constraint "
            "where connamespace = 'public'::regnamespace"
        )
    )
    indexes = sorted(
        tuple(r.values())
        for r in conn.execute(
            "select tablename, indexname, indexdef from pg_indexes where schemaname = 'public'"
        )
    )
    triggers = sorted(
        tuple(r.values())
        for r in conn.execute(
            "select tgrelid::regclass::text as tbl, tgname, pg_get_triggerdef(oid) as def "
            "from pg_trigger where not tgisinternal"
        )
    )
    functions = sorted(
        tuple(r.values())
        for r in conn.execute(
            "select p.proname, pg_get_function_arguments(p.oid) as args, "
            "pg_get_function_result(p.oid) as result, l.lanname, p.provolatile "
            "from pg_proc p join pg_language l on l.oid = p.prolang "
            "where p.pronamespace = 'public'::regnamespace"
        )
    )
    return {
        "tables": [t for t in tables if keep(t)],
        "columns": [c for c in columns if keep(c[0])],
        "constraints": [c for c in constraints if keep(c[0]) and keep(c[1])],
        "indexes": [i for i in indexes if keep(i[0]) and keep(i[1])],
        "triggers": [t for t in triggers if keep(t[1])],
        "functions": [f for f in functions if keep(f[0])],
    }


def pg_meta(conn: Any) -> list[tuple[str, str]]:
    return [
        (r["key"], r["value"])
        for r in conn.execute("select key, value from cairnq_meta order by key")
    ]
