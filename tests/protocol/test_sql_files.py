"""The protocol's SQL files, checked directly against SQLite and Postgres.

- Schema parity: our shared migrations build exactly the objects the public SDK
  (`cairnq` 0.15.1) builds, record the same ledger names and the same meta rows.
- Every migration can be re-run and leaves the same schema.
- Every statement file parses and runs on a migrated database.
- The claim variants differ from claim.sql only in their specialized predicates.
- Semantic spot checks (SQLite): claim order, fail and recover_leases branches,
  complete_many's per-row ownership and cancel-wins.

The files are applied by a small local helper on purpose: this module tests the files,
not the store's runner.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2] / "protocol"
DIALECTS = ("sqlite", "postgres")
TERMINAL = ("succeeded", "failed", "canceled")

_LINE_COMMENT = re.compile(r"--[^\n]*")
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")

LEASE_EXPIRED = json.dumps(
    {
        "type": "LeaseExpired",
        "code": "lease_expired",
        "message": "task lease expired and max attempts reached",
        "retryable": False,
        "details": {},
    }
)
HANDLER_ERROR = json.dumps(
    {
        "type": "ValueError",
        "code": "handler_error",
        "message": "boom",
        "retryable": True,
        "details": {},
    }
)


# --------------------------------------------------------------------------- files


def migration_files(dialect: str) -> list[Path]:
    return sorted((ROOT / "migrations" / dialect).glob("*.sql"))


def extension_migration_files(dialect: str) -> list[Path]:
    return sorted((ROOT / "extensions" / "migrations" / dialect).glob("*.sql"))


def statement_files(dialect: str) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in (ROOT / "sql" / dialect, ROOT / "extensions" / "sql" / dialect):
        for path in sorted(folder.glob("*.sql")):
            found[f"{'sql' if folder.parent == ROOT / 'sql' else 'extensions'}/{path.stem}"] = path
    return found


def strip_comments(sql: str) -> str:
    return _LINE_COMMENT.sub("", sql)


def statement_text(dialect: str, op: str, *, extension: bool = False) -> str:
    folder = ROOT / ("extensions/sql" if extension else "sql") / dialect
    return strip_comments((folder / f"{op}.sql").read_text(encoding="utf-8")).strip()


def split_sqlite(sql: str) -> list[str]:
    """Statements of a SQLite migration, split the way the runners split them."""
    out: list[str] = []
    pending = ""
    for line in sql.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            if strip_comments(pending).strip().strip(";").strip():
                out.append(pending)
            pending = ""
    assert not strip_comments(pending).strip(), f"unterminated statement: {pending!r}"
    return out


def to_psycopg(sql: str) -> str:
    return _PARAM.sub(lambda m: f"%({m.group(1)})s", strip_comments(sql).replace("%", "%%"))


def normalize(sql: str) -> str:
    return " ".join(strip_comments(sql).split()).lower()


# --------------------------------------------------------------------------- sqlite


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


@pytest.fixture(scope="module")
def upstream_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cairnq = pytest.importorskip("cairnq")
    path = tmp_path_factory.mktemp("upstream") / "upstream.db"

    async def build() -> None:
        client = cairnq.CairnQ.sqlite(str(path))
        await client.connect()
        await client.close()

    asyncio.run(build())
    return path


# --------------------------------------------------------------------------- postgres

PG_DSN = os.environ.get("CAIRNQD_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_url(dbname: str) -> str:
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

        return self._psycopg.connect(_pg_url(dbname), autocommit=autocommit, row_factory=dict_row)

    def close(self) -> None:
        for name in self.created:
            self.admin.execute(f'drop database if exists "{name}" with (force)')
        self.admin.close()


@pytest.fixture(scope="module")
def pg() -> Iterator[PgDatabases]:
    try:
        dbs = PgDatabases()
    except Exception as exc:
        if os.environ.get("CAIRNQD_REQUIRE_PG") == "1":
            raise
        pytest.skip(f"Postgres unreachable at {PG_DSN}: {exc}")
    try:
        yield dbs
    finally:
        dbs.close()


def pg_apply(conn: Any, files: list[Path], ledger: str | None) -> None:
    """One transaction per file, ledger locked first, like the runners."""
    folder = {"cairnq": ROOT / "sql", "cairnqd": ROOT / "extensions" / "sql"}
    if ledger:
        with conn.transaction():
            conn.execute(
                to_psycopg((folder[ledger] / "postgres" / "ledger_create.sql").read_text())
            )
    for path in files:
        with conn.transaction():
            if ledger:
                conn.execute(
                    to_psycopg((folder[ledger] / "postgres" / "ledger_lock.sql").read_text())
                )
            # No parameters: psycopg uses the simple protocol, so many statements are fine.
            conn.execute(path.read_text(encoding="utf-8"))
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


@pytest.fixture(scope="module")
def upstream_pg(pg: PgDatabases) -> str:
    cairnq = pytest.importorskip("cairnq")
    name = pg.create("upstream")

    async def build() -> None:
        client = cairnq.CairnQ.postgres(_pg_url(name), min_size=1, max_size=1)
        await client.connect()
        await client.close()

    asyncio.run(build())
    return name


# --------------------------------------------------------------------------- parity


def test_sqlite_schema_matches_upstream(upstream_sqlite: Path, tmp_path: Path) -> None:
    ours = sqlite_ours(tmp_path / "ours.db")
    theirs = sqlite_connect(upstream_sqlite)
    ours_schema, their_schema = sqlite_schema(ours), sqlite_schema(theirs)
    assert ours_schema["tables"].keys() == their_schema["tables"].keys()
    for table in their_schema["tables"]:
        assert ours_schema["tables"][table] == their_schema["tables"][table], table
    assert ours_schema["indexes"] == their_schema["indexes"]
    assert ours_schema["triggers"] == their_schema["triggers"] == []
    assert ours_schema == their_schema
    assert (
        sqlite_meta(ours)
        == sqlite_meta(theirs)
        == [
            ("protocol_version", "1"),
            ("schema_version", "10"),
        ]
    )
    assert sqlite_ledger(ours) == sqlite_ledger(theirs)
    assert "0003_notify.sql" not in sqlite_ledger(ours)
    # Everything else we add is ours by name and in our own ledger.
    extra = {r[0] for r in ours.execute("select name from sqlite_master")} - {
        r[0] for r in theirs.execute("select name from sqlite_master")
    }
    assert extra == {
        "cairnqd_migrations",
        "sqlite_autoindex_cairnqd_migrations_1",
        "cairnqd_task_keys_task_id_idx",
    }
    assert sqlite_ledger(ours, "cairnqd_migrations") == {"cairnqd_0001_task_keys_task_idx.sql"}


def test_postgres_schema_matches_upstream(pg: PgDatabases, upstream_pg: str) -> None:
    ours_name = pg_ours(pg, "parity")
    with pg.connect(ours_name) as ours, pg.connect(upstream_pg) as theirs:
        ours_schema, their_schema = pg_schema(ours), pg_schema(theirs)
        for part in their_schema:
            assert ours_schema[part] == their_schema[part], part
        assert any(f[0] == "cairnq_notify" and f[2] == "trigger" for f in ours_schema["functions"])
        assert [t[1] for t in ours_schema["triggers"]] == ["cairnq_tasks_notify"]
        assert (
            pg_meta(ours)
            == pg_meta(theirs)
            == [("protocol_version", "1"), ("schema_version", "10")]
        )
        ledger = "select name from cairnq_migrations"
        ours_ledger = {r["name"] for r in ours.execute(ledger)}
        assert ours_ledger == {r["name"] for r in theirs.execute(ledger)}
        assert "0003_notify.sql" in ours_ledger
        assert {r["name"] for r in ours.execute("select name from cairnqd_migrations")} == {
            "cairnqd_0001_task_keys_task_idx.sql"
        }
        # Nothing of ours outside the cairnqd_ namespace.
        assert pg_schema(ours, skip_prefix=None)["indexes"] != ours_schema["indexes"]
        extra = set(pg_schema(ours, skip_prefix=None)["indexes"]) - set(their_schema["indexes"])
        assert {i[1] for i in extra} == {"cairnqd_migrations_pkey", "cairnqd_task_keys_task_id_idx"}


def _upstream_connect_sqlite(path: Path) -> None:
    cairnq = pytest.importorskip("cairnq")

    async def go() -> None:
        client = cairnq.CairnQ.sqlite(str(path))
        await client.connect()
        await client.close()

    asyncio.run(go())


def test_sqlite_migration_finished_by_the_other_side(upstream_sqlite: Path, tmp_path: Path) -> None:
    """Part-migrated by us, finished by upstream, and the reverse: same schema either way."""
    reference = sqlite_schema(sqlite_connect(upstream_sqlite))
    ours = sqlite_connect(tmp_path / "half.db")
    half = [p for p in migration_files("sqlite") if p.name < "0006"]
    sqlite_apply(ours, half, "cairnq")
    ours.close()
    _upstream_connect_sqlite(tmp_path / "half.db")
    finished = sqlite_connect(tmp_path / "half.db")
    assert sqlite_schema(finished) == reference
    assert sqlite_ledger(finished) == sqlite_ledger(sqlite_connect(upstream_sqlite))

    # Upstream's full database with its last three ledger rows lost: ours replays them.
    theirs = tmp_path / "theirs.db"
    theirs.write_bytes(upstream_sqlite.read_bytes())
    conn = sqlite_connect(theirs)
    conn.execute("delete from cairnq_migrations where name >= '0008'")
    missing = [p for p in migration_files("sqlite") if p.name >= "0008"]
    sqlite_apply(conn, missing, "cairnq")
    assert sqlite_schema(conn) == reference
    assert sqlite_meta(conn) == [("protocol_version", "1"), ("schema_version", "10")]
    conn.close()
    # And upstream accepts a database we created, without replaying anything.
    sqlite_ours(tmp_path / "ours.db").close()
    before = (
        sqlite_connect(tmp_path / "ours.db")
        .execute("select name, applied_at_ms from cairnq_migrations order by name")
        .fetchall()
    )
    _upstream_connect_sqlite(tmp_path / "ours.db")
    after = (
        sqlite_connect(tmp_path / "ours.db")
        .execute("select name, applied_at_ms from cairnq_migrations order by name")
        .fetchall()
    )
    assert [tuple(r) for r in after] == [tuple(r) for r in before]


def test_postgres_migration_finished_by_the_other_side(pg: PgDatabases, upstream_pg: str) -> None:
    cairnq = pytest.importorskip("cairnq")
    with pg.connect(upstream_pg) as conn:
        reference = pg_schema(conn)
        reference_ledger = {r["name"] for r in conn.execute("select name from cairnq_migrations")}

    async def upstream_connect(dbname: str) -> None:
        client = cairnq.CairnQ.postgres(_pg_url(dbname), min_size=1, max_size=1)
        await client.connect()
        await client.close()

    half = pg.create("half")
    with pg.connect(half) as conn:
        pg_apply(conn, [p for p in migration_files("postgres") if p.name < "0006"], "cairnq")
    asyncio.run(upstream_connect(half))
    with pg.connect(half) as conn:
        assert pg_schema(conn) == reference
        assert {r["name"] for r in conn.execute("select name from cairnq_migrations")} == (
            reference_ledger
        )

    theirs = pg.create("theirs")
    asyncio.run(upstream_connect(theirs))
    with pg.connect(theirs) as conn:
        conn.execute("delete from cairnq_migrations where name >= '0003'")
        conn.commit()
        pg_apply(conn, [p for p in migration_files("postgres") if p.name >= "0003"], "cairnq")
        assert pg_schema(conn) == reference
        assert pg_meta(conn) == [("protocol_version", "1"), ("schema_version", "10")]


def _notify_script(conn: Any) -> None:
    """Transitions that must (or must not) notify, each in its own transaction."""
    now = int(time.time() * 1000)
    cols = "(id, name, queue, status, payload, run_at_ms, created_at_ms, updated_at_ms)"

    def insert(tid: str, queue: str, status: str) -> str:
        values = f"('{tid}', 'n', '{queue}', '{status}', '{{}}', {now}, {now}, {now})"
        return f"insert into cairnq_tasks {cols} values {values}"

    for sql in (
        insert("t1", "q1", "queued"),
        insert("t2", "q2", "running"),
        insert("t3", "q3", "succeeded"),
        "update cairnq_tasks set status = 'running' where id = 't1'",
        "update cairnq_tasks set progress = 0.5 where id = 't1'",
        "update cairnq_tasks set status = 'queued' where id = 't1'",
        "update cairnq_tasks set status = 'queued' where id = 't1'",
        "update cairnq_tasks set status = 'canceled' where id = 't1'",
        "update cairnq_tasks set status = 'failed' where id = 't1'",
        "update cairnq_tasks set status = 'queued' where id = 't1'",
        "update cairnq_tasks set status = 'succeeded' where id = 't2'",
    ):
        conn.execute(sql)


def test_postgres_notify_matches_upstream(pg: PgDatabases, upstream_pg: str) -> None:
    expected = [
        ("cairnq_queued", "q1"),
        ("cairnq_queued", "q1"),
        ("cairnq_done", "t1"),
        ("cairnq_queued", "q1"),
        ("cairnq_done", "t2"),
    ]
    seen = {}
    for name in (pg_ours(pg, "notify"), upstream_pg):
        with pg.connect(name, autocommit=True) as listener, pg.connect(name, autocommit=True) as w:
            listener.execute("listen cairnq_queued")
            listener.execute("listen cairnq_done")
            w.execute("delete from cairnq_tasks where id in ('t1', 't2', 't3')")
            _notify_script(w)
            got = [
                (n.channel, n.payload)
                for n in listener.notifies(timeout=5, stop_after=len(expected))
            ]
            w.execute("delete from cairnq_tasks where id in ('t1', 't2', 't3')")
            seen[name] = got
    assert list(seen.values()) == [expected, expected]


# --------------------------------------------------------------------------- idempotence


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
    for path in migration_files("sqlite") + extension_migration_files("sqlite"):
        text = path.read_text()
        assert "begin" not in normalize(text).split(), f"{path.name}: no BEGIN..END in SQLite"
        assert split_sqlite(text), path.name


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


# --------------------------------------------------------------------------- statements


def _now() -> int:
    return int(time.time() * 1000)


def _params(dialect: str) -> dict[str, Any]:
    """A superset of every statement's parameters, bound the store's way."""
    now = _now()
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
        "progress": 0.5,
        "message": "half",
        "result": '{"ok": true}',
        "error": HANDLER_ERROR,
        "max_depth": 5,
        "items": json.dumps([{"id": "task_run", "r": '{"ok": true}'}]),
        "running": "running",
        "table_name": "cairnq_migrations",
        # The daemon's session locks (two-int4 advisory key space).
        "lock_namespace": 1668378212,
        "lock_id": 1,
        # insert_many: SQLite reads one JSON array, Postgres parallel arrays.
        **_insert_many_params(sqlite),
    }


def _insert_many_params(sqlite: bool) -> dict[str, Any]:
    row = {
        "id": "task_many",
        "name": "n",
        "queue": "default",
        "p": '{"a": 1}',
        "m": "{}",
        "max_attempts": 3,
        "priority": 0,
        "parent_id": None,
        "root_id": "task_many",
        "correlation_id": None,
        "delay_ms": 0,
    }
    del sqlite  # both dialects read the same JSON array
    return {"new_tasks": json.dumps([row])}


# An expected row count of AT_LEAST_ONE: the ledgers hold one row per applied migration.
AT_LEAST_ONE = -1

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
    "extensions/complete_many": ({}, 1),
    "extensions/insert_many": ({}, 1),
    "extensions/purge_count": (dict.fromkeys(("status", "queue", "name")), 1),
    "extensions/connection_limits": ({}, 1),
    "sql/ledger_names": ({}, AT_LEAST_ONE),
    "sql/ledger_list": ({}, AT_LEAST_ONE),
    "sql/ledger_exists": ({"table_name": "cairnq_migrations"}, 1),
    "extensions/ledger_names": ({}, AT_LEAST_ONE),
    "extensions/ledger_list": ({}, AT_LEAST_ONE),
    "extensions/oldest_queued": ({}, 1),
    "extensions/leases_expired": ({}, 1),
    "extensions/try_session_lock": ({}, 1),
    "extensions/release_session_lock": ({}, 1),
    "extensions/wal_checkpoint": ({}, 1),
}

_PG_ONLY = {
    "extensions/connection_limits",
    "sql/installations",
    "sql/lock_key",
    "sql/ledger_lock",
    "extensions/ledger_lock",
    "extensions/try_session_lock",
    "extensions/release_session_lock",
}
_SQLITE_ONLY = {"extensions/wal_checkpoint"}


def test_statement_inventory() -> None:
    for dialect in DIALECTS:
        only_other = _SQLITE_ONLY if dialect == "postgres" else _PG_ONLY
        expected = {op for op in _STATEMENT_CASES if op not in only_other}
        assert set(statement_files(dialect)) == expected, dialect


def _seed_rows() -> list[tuple[str, str, str, str, str | None, int | None, int, int | None]]:
    """(id, queue, name, status, worker_id, lease_until_ms, run_at_ms, completed_at_ms)."""
    now = _now()
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
        params = {**_params("sqlite"), **overrides}
        conn.execute("begin")
        try:
            cur = conn.execute(strip_comments(path.read_text()), params)
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
            try:
                cur = conn.execute(to_psycopg(path.read_text()), params)
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
            used = set(_PARAM.findall(strip_comments(path.read_text())))
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


# --------------------------------------------------------------------------- claim variants

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


# --------------------------------------------------------------------------- semantics (SQLite)


class Lite:
    """Run protocol statements on a migrated SQLite database, binding like the store."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite_ours(path)

    def run(self, op: str, *, extension: bool = False, **params: Any) -> list[dict[str, Any]]:
        now = params.pop("now", None) or _now()
        bound = {
            "now_ms": now,
            "lease_until_ms": now + params.pop("lease_ms", 30_000),
            "run_at_ms": now + params.pop("delay_ms", 0),
            "before_ms": now - params.pop("older_than_ms", 0),
            **params,
        }
        for name in ("queues", "names", "ids"):
            if isinstance(bound.get(name), list):
                bound[name] = json.dumps(bound[name])
        cur = self.conn.execute(statement_text("sqlite", op, extension=extension), bound)
        return [dict(r) for r in cur.fetchall()] if cur.description else []

    def submit(self, tid: str, *, now: int, queue: str = "q", name: str = "n", **kw: Any) -> None:
        self.run(
            "insert_task",
            now=now,
            id=tid,
            name=name,
            queue=queue,
            payload="{}",
            metadata="{}",
            max_attempts=kw.pop("max_attempts", 3),
            priority=kw.pop("priority", 0),
            parent_id=None,
            root_id=tid,
            correlation_id=None,
            **kw,
        )

    def row(self, tid: str) -> dict[str, Any]:
        return self.run("get", id=tid)[0]

    def claim_all(self, tid_worker: str = "w1", **kw: Any) -> list[str]:
        kw.setdefault("queues", ["q"])
        kw.setdefault("names", None)
        return sorted(r["id"] for r in self.run("claim", worker_id=tid_worker, limit=100, **kw))


@pytest.fixture
def lite(tmp_path: Path) -> Lite:
    return Lite(tmp_path / "semantics.db")


def test_claim_order_and_filters(lite: Lite) -> None:
    t0 = 1_000_000
    # (id, priority, delay): claim order is priority desc, run_at asc, id asc.
    for tid, priority, delay in [
        ("task_e", 0, 5),
        ("task_d", 0, 0),
        ("task_c", 0, 0),
        ("task_b", 5, 10),
        ("task_a", 1, 0),
        ("task_late", 9, 10_000),
    ]:
        lite.submit(tid, now=t0, priority=priority, delay_ms=delay)
    lite.submit("task_other", now=t0, queue="elsewhere")
    lite.submit("task_named", now=t0, name="special", priority=-1)
    order = []
    for op, extra in [
        ("claim", {"queues": ["q"], "names": None}),
        ("claim_one_queue", {"queue": "q", "names": None}),
        ("claim_one_name", {"queues": ["q", "x"], "name": "n"}),
        ("claim_one_queue_one_name", {"queue": "q", "name": "n"}),
        ("claim", {"queues": ["q"], "names": ["n"]}),
    ]:
        got = lite.run(op, now=t0 + 100, worker_id="w", limit=1, **extra)
        assert len(got) == 1
        row = got[0]
        assert (row["status"], row["attempt"], row["worker_id"]) == ("running", 1, "w")
        assert row["lease_until_ms"] == t0 + 100 + 30_000
        order.append(row["id"])
    assert order == ["task_b", "task_a", "task_c", "task_d", "task_e"]
    # Not yet due, other names, other queues and an empty name list are never claimed.
    assert lite.claim_all(now=t0 + 100, names=[]) == []
    assert lite.claim_all(now=t0 + 100, names=["n"]) == []
    assert lite.claim_all(now=t0 + 100) == ["task_named"]
    assert lite.claim_all(now=t0 + 20_000) == ["task_late"]
    assert lite.row("task_other")["status"] == "queued"


def test_claimable_probe(lite: Lite) -> None:
    t0 = 2_000_000
    lite.submit("task_x", now=t0, queue="q", name="a", delay_ms=1000)

    def probe(now: int, **kw: Any) -> int:
        kw.setdefault("queues", ["q"])
        kw.setdefault("names", None)
        return lite.run("claimable_probe", now=now, **kw)[0]["has_work"]

    assert probe(t0) == 0  # not due yet
    assert probe(t0 + 1000) == 1
    assert probe(t0 + 1000, names=["b"]) == 0
    assert probe(t0 + 1000, queues=["other"]) == 0
    lite.run("claim", now=t0 + 1000, queues=["q"], names=None, worker_id="w", limit=1)
    assert probe(t0 + 1000) == 0
    # An expired lease anywhere counts, whatever the queue or name filter.
    assert probe(t0 + 1000 + 30_000, queues=["other"], names=["zzz"]) == 1


def _running(lite: Lite, tid: str, *, now: int, max_attempts: int = 3, attempts: int = 1) -> None:
    """Submit `tid` (named after itself) and claim it `attempts` times as w1."""
    lite.submit(tid, now=now, name=tid, max_attempts=max_attempts)
    for i in range(attempts):
        if i:  # put it back for another attempt
            lite.conn.execute(
                "update cairnq_tasks set status = 'queued', lease_until_ms = null where id = ?",
                (tid,),
            )
        claimed = lite.run(
            "claim_one_queue_one_name", now=now, queue="q", name=tid, worker_id="w1", limit=1
        )
        assert [r["id"] for r in claimed] == [tid]
    lite.run("progress", now=now, id=tid, worker_id="w1", progress=0.4, message="working")


def test_fail_branches(lite: Lite) -> None:
    t0 = 3_000_000
    _running(lite, "task_retry", now=t0)
    _running(lite, "task_final", now=t0, max_attempts=1)
    _running(lite, "task_noretry", now=t0)
    _running(lite, "task_cancel", now=t0)
    lite.run("cancel", now=t0 + 1, id="task_cancel")
    t1 = t0 + 10

    def fail(tid: str, retryable: int) -> dict[str, Any]:
        rows = lite.run(
            "fail",
            now=t1,
            id=tid,
            worker_id="w1",
            error=HANDLER_ERROR,
            retryable=retryable,
            delay_ms=500,
        )
        assert len(rows) == 1, tid
        return rows[0]

    requeued = fail("task_retry", 1)
    assert requeued["status"] == "queued"
    assert requeued["worker_id"] is None and requeued["lease_until_ms"] is None
    assert requeued["run_at_ms"] == t1 + 500 and requeued["completed_at_ms"] is None
    assert requeued["progress"] is None and requeued["message"] is None
    assert json.loads(requeued["error"])["code"] == "handler_error"
    assert requeued["attempt"] == 1

    for tid, retryable in (("task_final", 1), ("task_noretry", 0)):
        failed = fail(tid, retryable)
        assert failed["status"] == "failed", tid
        assert failed["worker_id"] == "w1" and failed["lease_until_ms"] is None
        assert failed["completed_at_ms"] == t1 and failed["error"] is not None
        assert failed["progress"] == 0.4 and failed["message"] == "working"

    canceled = fail("task_cancel", 1)
    assert canceled["status"] == "canceled" and canceled["completed_at_ms"] == t1
    assert canceled["worker_id"] == "w1" and canceled["error"] is not None
    assert canceled["lease_until_ms"] is None

    # A settled task is no longer owned: a second settlement finds nothing.
    assert (
        lite.run(
            "fail",
            now=t1,
            id="task_final",
            worker_id="w1",
            error=HANDLER_ERROR,
            retryable=1,
            delay_ms=0,
        )
        == []
    )


def test_owned_writes_need_a_live_lease(lite: Lite) -> None:
    t0 = 4_000_000
    _running(lite, "task_own", now=t0)
    lease_end = t0 + 30_000
    assert lite.run("heartbeat", now=t0 + 1, id="task_own", worker_id="w2") == []
    assert lite.run("heartbeat", now=lease_end, id="task_own", worker_id="w1") == []
    beat = lite.run("heartbeat", now=t0 + 100, id="task_own", worker_id="w1")
    assert beat[0]["lease_until_ms"] == t0 + 100 + 30_000
    both = lite.run("heartbeat_batch", now=t0 + 200, ids=["task_own", "nope"], worker_id="w1")
    assert both == [{"id": "task_own", "attempt": 1, "cancel_requested_at_ms": None}]
    kept = lite.run(
        "progress",
        now=t0 + 300,
        id="task_own",
        worker_id="w1",
        progress=None,
        message="only the label",
    )
    assert (kept[0]["progress"], kept[0]["message"]) == (0.4, "only the label")
    done = lite.run("complete", now=t0 + 400, id="task_own", worker_id="w1", result='"fine"')
    assert (done[0]["status"], done[0]["result"], done[0]["progress"]) == (
        "succeeded",
        '"fine"',
        1.0,
    )
    assert done[0]["lease_until_ms"] is None and done[0]["completed_at_ms"] == t0 + 400


def test_recover_leases_branches(lite: Lite) -> None:
    t0 = 5_000_000
    _running(lite, "task_again", now=t0)
    _running(lite, "task_spent", now=t0, max_attempts=2, attempts=2)
    _running(lite, "task_cxl", now=t0, max_attempts=1)
    lite.run("cancel", now=t0 + 5, id="task_cxl")
    _running(lite, "task_fresh", now=t0 + 20_000)
    expire = t0 + 30_000
    got = lite.run("recover_leases", now=expire, error=LEASE_EXPIRED)
    assert sorted((r["id"], r["status"]) for r in got) == [
        ("task_again", "queued"),
        ("task_cxl", "canceled"),
        ("task_spent", "failed"),
    ]
    again, spent, cxl = lite.row("task_again"), lite.row("task_spent"), lite.row("task_cxl")
    assert again["worker_id"] is None and again["run_at_ms"] == expire
    assert again["progress"] is None and again["message"] is None
    assert again["completed_at_ms"] is None and again["error"] is None
    assert again["attempt"] == 1
    assert spent["attempt"] == 2 and json.loads(spent["error"])["code"] == "lease_expired"
    assert spent["completed_at_ms"] == expire and spent["worker_id"] == "w1"
    assert cxl["error"] is None and cxl["completed_at_ms"] == expire
    for row in (again, spent, cxl):
        assert row["lease_until_ms"] is None and row["updated_at_ms"] == expire
    assert lite.row("task_fresh")["status"] == "running"
    assert lite.run("recover_leases", now=expire, error=LEASE_EXPIRED) == []


def test_release_worker(lite: Lite) -> None:
    t0 = 6_000_000
    _running(lite, "task_mine", now=t0)
    lite.submit("task_theirs", now=t0)
    lite.run("claim", now=t0, queues=["q"], names=None, worker_id="w2", limit=1)
    got = lite.run(
        "release_worker", extension=True, now=t0 + 1, worker_id="w1", error=LEASE_EXPIRED
    )
    assert got == [{"id": "task_mine", "queue": "q", "name": "task_mine", "status": "queued"}]
    assert lite.row("task_theirs")["status"] == "running"


def test_complete_many(lite: Lite) -> None:
    t0 = 7_000_000
    values: dict[str, Any] = {
        "task_str": "a string",
        "task_num": 42,
        "task_real": 2.5,
        "task_true": True,
        "task_false": False,
        "task_none": None,
        "task_obj": {"k": [1, "two", None]},
    }
    for tid in [*values, "task_cxl", "task_other", "task_expired"]:
        _running(lite, tid, now=t0)
    lite.run("cancel", now=t0 + 1, id="task_cxl")
    lite.conn.execute("update cairnq_tasks set worker_id = 'w2' where id = 'task_other'")
    lite.conn.execute("update cairnq_tasks set lease_until_ms = ? where id = 'task_expired'", (t0,))
    # The store sends each result already encoded as JSON text ("r"), None for SQL NULL.
    encoded = {tid: None if v is None else json.dumps(v) for tid, v in values.items()}
    items = [{"id": tid, "r": text} for tid, text in encoded.items()]
    items += [{"id": tid, "r": '{"x": 1}'} for tid in ("task_cxl", "task_other", "task_expired")]
    items.append({"id": "task_missing", "r": None})
    got = lite.run(
        "complete_many", extension=True, now=t0 + 10, worker_id="w1", items=json.dumps(items)
    )
    assert sorted((r["id"], r["status"]) for r in got) == sorted(
        [(tid, "succeeded") for tid in values] + [("task_cxl", "canceled")]
    )
    for tid in values:
        row = lite.row(tid)
        assert row["result"] == encoded[tid], tid  # the store's bytes, untouched
        assert (row["progress"], row["lease_until_ms"], row["completed_at_ms"]) == (
            1.0,
            None,
            t0 + 10,
        )
    cxl = lite.row("task_cxl")
    assert (cxl["result"], cxl["progress"], cxl["lease_until_ms"]) == (None, 0.4, None)
    for tid in ("task_other", "task_expired"):
        assert lite.row(tid)["status"] == "running"


def test_cancel_retry_purge(lite: Lite) -> None:
    t0 = 8_000_000
    lite.submit("task_q", now=t0)
    _running(lite, "task_r", now=t0)
    queued = lite.run("cancel", now=t0 + 1, id="task_q")[0]
    assert (queued["status"], queued["completed_at_ms"]) == ("canceled", t0 + 1)
    running = lite.run("cancel", now=t0 + 2, id="task_r")[0]
    assert (running["status"], running["cancel_requested_at_ms"]) == ("running", t0 + 2)
    assert lite.run("cancel", now=t0 + 3, id="task_r")[0]["cancel_requested_at_ms"] == t0 + 3
    assert lite.run("cancel", now=t0 + 4, id="task_q") == []
    lite.run("complete", now=t0 + 5, id="task_r", worker_id="w1", result='{"kept": 1}')
    assert lite.row("task_r")["status"] == "canceled"
    assert lite.run("retry", now=t0 + 6, id="task_r", reset_attempt=1)[0]["attempt"] == 0
    retried = lite.row("task_r")
    assert retried["status"] == "queued" and retried["cancel_requested_at_ms"] is None
    assert retried["run_at_ms"] == t0 + 6 and retried["completed_at_ms"] is None
    assert lite.run("retry", now=t0 + 7, id="task_r", reset_attempt=0) == []
    lite.run("upsert_key", now=t0, key="kq", task_id="task_q")
    # Strict cutoff: finished at t0+1 survives a purge at t0+1 with older_than 0.
    purge = {"queue": None, "status": None, "name": None, "limit": 10}
    assert lite.run("purge", now=t0 + 1, **purge) == []
    assert lite.run("purge", now=t0 + 2, **{**purge, "status": "failed"}) == []
    assert lite.run("purge", now=t0 + 2, **{**purge, "queue": "q"}) == [{"id": "task_q"}]
    assert lite.run("get_key", key="kq") == []  # the key row cascaded


def test_depth_stats_and_extension_reads(lite: Lite) -> None:
    t0 = 9_000_000
    for i in range(4):
        lite.submit(f"task_{i}", now=t0 + i, delay_ms=100 * i)
    lite.submit("task_z", now=t0, queue="z")
    assert lite.run("queue_depth", queue="q", max_depth=10)[0]["headroom"] == 6
    assert lite.run("queue_depth", queue="q", max_depth=3)[0]["headroom"] == 0
    stats = lite.run("stats", queue=None)
    assert sorted((r["queue"], r["status"], r["n"]) for r in stats) == [
        ("q", "queued", 4),
        ("z", "queued", 1),
    ]
    assert lite.run("stats", queue="z") == [{"queue": "z", "status": "queued", "n": 1}]
    oldest = lite.run("oldest_queued", extension=True, now=t0 + 150)
    assert sorted((r["queue"], r["age_ms"]) for r in oldest) == [("q", 150), ("z", 150)]
    _running(lite, "task_lease", now=t0)
    expired = lite.run("leases_expired", extension=True, now=t0 + 30_000)
    assert expired == [{"queue": "q", "n": 1}]
    assert lite.run("leases_expired", extension=True, now=t0 + 29_999) == []


# --------------------------------------------------------------------------- semantics (Postgres)


class Pg:
    """Run protocol statements on a migrated Postgres database, in autocommit."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def run(self, op: str, *, extension: bool = False, **params: Any) -> list[dict[str, Any]]:
        params.setdefault("running", "running")
        text = to_psycopg(statement_text("postgres", op, extension=extension))
        cur = self.conn.execute(text, params)
        return list(cur.fetchall()) if cur.description else []

    def submit(
        self, tid: str, *, run_at: int, priority: int = 0, name: str = "n", max_attempts: int = 3
    ) -> None:
        self.run(
            "insert_task",
            id=tid,
            name=name,
            queue="q",
            payload="{}",
            metadata="{}",
            max_attempts=max_attempts,
            priority=priority,
            parent_id=None,
            root_id=tid,
            correlation_id=None,
            delay_ms=0,
        )
        self.conn.execute("update cairnq_tasks set run_at_ms = %s where id = %s", (run_at, tid))

    def claim(self, tid: str) -> None:
        got = self.run(
            "claim_one_queue_one_name",
            queue="q",
            name=tid,
            worker_id="w1",
            limit=1,
            lease_ms=60_000,
        )
        assert [r["id"] for r in got] == [tid]

    def row(self, tid: str) -> dict[str, Any]:
        return self.run("get", id=tid)[0]


def test_postgres_semantics(pg: PgDatabases) -> None:
    with pg.connect(pg_ours(pg, "semantics"), autocommit=True) as conn:
        db = Pg(conn)
        past = _now() - 60_000
        for tid, priority, offset in [
            ("task_e", 0, 5),
            ("task_d", 0, 0),
            ("task_c", 0, 0),
            ("task_b", 5, 10),
            ("task_a", 1, 0),
        ]:
            db.submit(tid, run_at=past + offset, priority=priority)
        db.submit("task_late", run_at=_now() + 600_000, priority=9)
        order = []
        for op, extra in [
            ("claim", {"queues": ["q"], "names": None}),
            ("claim_one_queue", {"queue": "q", "names": None}),
            ("claim_one_name", {"queues": ["q", "x"], "name": "n"}),
            ("claim_one_queue_one_name", {"queue": "q", "name": "n"}),
            ("claim", {"queues": ["q"], "names": ["n"]}),
        ]:
            (row,) = db.run(op, worker_id="w", limit=1, lease_ms=30_000, **extra)
            assert (row["status"], row["attempt"], row["worker_id"]) == ("running", 1, "w")
            assert row["lease_until_ms"] - row["updated_at_ms"] == 30_000
            order.append(row["id"])
        assert order == ["task_b", "task_a", "task_c", "task_d", "task_e"]
        assert db.run("claim", queues=["q"], names=[], worker_id="w", limit=9, lease_ms=1) == []
        assert db.run("claim", queues=["q"], names=None, worker_id="w", limit=9, lease_ms=1) == []
        probe = db.run("claimable_probe", queues=["q"], names=None)
        assert probe == [{"has_work": False}]

        # fail: requeue, final failure, cancel wins.
        for tid, attempts in (("task_f1", 3), ("task_f2", 1), ("task_f3", 3)):
            db.submit(tid, run_at=past, name=tid, max_attempts=attempts)
            db.claim(tid)
        db.run("cancel", id="task_f3")
        outcome = {}
        for tid in ("task_f1", "task_f2", "task_f3"):
            (row,) = db.run(
                "fail", id=tid, worker_id="w1", error=HANDLER_ERROR, retryable=True, delay_ms=5_000
            )
            outcome[tid] = row
            assert row["lease_until_ms"] is None and row["error"]["code"] == "handler_error"
        assert outcome["task_f1"]["status"] == "queued" and outcome["task_f1"]["worker_id"] is None
        assert outcome["task_f1"]["run_at_ms"] - outcome["task_f1"]["updated_at_ms"] == 5_000
        assert outcome["task_f2"]["status"] == "failed" and outcome["task_f2"]["worker_id"] == "w1"
        assert outcome["task_f3"]["status"] == "canceled"
        assert db.run("retry", id="task_f2", reset_attempt=True)[0]["attempt"] == 0

        # recover_leases: requeue, lease-expired failure, cancel wins.
        for tid, attempts in (("task_r1", 3), ("task_r2", 1), ("task_r3", 3)):
            db.submit(tid, run_at=past, name=tid, max_attempts=attempts)
            db.claim(tid)
        db.run("cancel", id="task_r3")
        conn.execute(
            "update cairnq_tasks set lease_until_ms = %s where id like 'task_r%%'", (past,)
        )
        got = db.run("recover_leases", error=LEASE_EXPIRED)
        assert sorted((r["id"], r["status"]) for r in got) == [
            ("task_r1", "queued"),
            ("task_r2", "failed"),
            ("task_r3", "canceled"),
        ]
        assert db.row("task_r2")["error"]["code"] == "lease_expired"
        assert db.row("task_r3")["error"] is None
        assert db.row("task_r1")["worker_id"] is None

        # complete_many: per-row ownership, cancel wins, NULL results.
        for tid in ("task_m1", "task_m2", "task_m3", "task_m4"):
            db.submit(tid, run_at=past, name=tid)
            db.claim(tid)
        db.run("cancel", id="task_m3")
        conn.execute("update cairnq_tasks set worker_id = 'w2' where id = 'task_m4'")
        got = db.run(
            "complete_many",
            extension=True,
            worker_id="w1",
            items=json.dumps(
                [
                    {"id": "task_m1", "r": '"text"'},
                    {"id": "task_m2", "r": None},
                    {"id": "task_m3", "r": '{"x": 1}'},
                    {"id": "task_m4", "r": "1"},
                    {"id": "task_nope", "r": None},
                ]
            ),
        )
        assert sorted((r["id"], r["status"]) for r in got) == [
            ("task_m1", "succeeded"),
            ("task_m2", "succeeded"),
            ("task_m3", "canceled"),
        ]
        assert db.row("task_m1")["result"] == "text"
        assert db.row("task_m2")["result"] is None and db.row("task_m3")["result"] is None
        assert db.row("task_m4")["status"] == "running"

        # release_worker frees only that worker's running tasks.
        got = db.run("release_worker", extension=True, worker_id="w2", error=LEASE_EXPIRED)
        assert got == [{"id": "task_m4", "queue": "q", "name": "task_m4", "status": "queued"}]
        beat = db.run("heartbeat_batch", ids=["task_m4"], worker_id="w2", lease_ms=1000)
        assert beat == []
