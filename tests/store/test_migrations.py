"""Migrations, ledgers and the connect-time guards (docs/protocol.md §2.7, §3).

Every database here is real: a SQLite file in tmp_path or a fresh Postgres database.
Concurrent cold starts run in separate processes (SQLite) or on separate connections
(Postgres), and the old public SDK runs in a child process of its own.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import asyncpg
import cairnq
import psycopg
import pytest

from cairnqd.errors import (
    DatabaseUnavailable,
    NotACairnqDatabase,
    ProtocolVersionMismatch,
    SchemaMismatch,
)
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore
from tests.support.databases import make_store
from tests.support.store import (
    connect_upstream,
    extension_migrations,
    ledger,
    meta,
    pg_url,
    query,
    run_script,
    run_together,
    scalar,
    upstream_migrations,
)

# What a migration writes (its ledger rows and their times) is what these tests read.
pytestmark = pytest.mark.fresh_schema

# -- fresh databases ---------------------------------------------------------------------


async def test_fresh_database_has_both_ledgers_and_meta(
    store: Any, dialect: str, db_target: str
) -> None:
    shared = ledger(dialect, db_target)
    assert sorted(shared) == list(upstream_migrations(dialect))
    assert len(shared) == (9 if dialect == "sqlite" else 10)

    ours = ledger(dialect, db_target, "cairnqd_migrations")
    assert ours, "cairnqd_migrations holds no extension migration"
    assert sorted(ours) == list(extension_migrations(dialect))
    assert all(name.startswith("cairnqd_") for name in ours)
    # Never a non-upstream name in upstream's ledger (docs/protocol.md §2.4, §3.5).
    assert not [n for n in shared if n.startswith("cairnqd")]

    assert meta(dialect, db_target) == {"protocol_version": "1", "schema_version": "10"}
    assert await store.protocol_version() == 1

    now_ms = int(time.time() * 1000)
    for applied_at in (*shared.values(), *ours.values()):
        assert now_ms - 600_000 < applied_at <= now_ms + 5_000, "applied_at_ms is not epoch ms"


async def test_fresh_database_indexes(store: Any, dialect: str, db_target: str) -> None:
    if dialect == "sqlite":
        rows = query(dialect, db_target, "select name from sqlite_master where type = 'index'")
    else:
        rows = query(
            dialect, db_target, "select indexname from pg_indexes where schemaname = 'public'"
        )
    names = {r[0] for r in rows}
    expected = {
        "cairnq_tasks_claim_idx",
        "cairnq_tasks_claim_name_idx",
        "cairnq_tasks_name_idx",
        "cairnq_tasks_root_idx",
        "cairnq_tasks_correlation_idx",
        "cairnq_tasks_completed_idx",
        "cairnq_tasks_lease_idx",
        "cairnq_tasks_status_completed_idx",
        "cairnq_tasks_queue_completed_idx",
        "cairnqd_task_keys_task_id_idx",
    }
    assert expected <= names
    assert "cairnq_tasks_status_idx" not in names, "0010 must drop the status index"
    extra = {n for n in names - expected if not n.startswith(("sqlite_autoindex", "cairnqd_"))}
    assert extra <= {
        "cairnq_tasks_pkey",
        "cairnq_task_keys_pkey",
        "cairnq_meta_pkey",
        "cairnq_migrations_pkey",
        "cairnqd_migrations_pkey",
    }


async def test_reconnect_applies_nothing(store: Any, dialect: str, db_target: str) -> None:
    before = ledger(dialect, db_target), ledger(dialect, db_target, "cairnqd_migrations")
    again = make_store(dialect, db_target)
    await again.connect()
    await again.close()
    after = ledger(dialect, db_target), ledger(dialect, db_target, "cairnqd_migrations")
    assert after == before


# -- concurrent cold starts --------------------------------------------------------------

OURS_SQLITE_CONNECT = """
import asyncio
from cairnqd.store.sqlite import SQLiteStore
async def main():
    barrier()
    store = SQLiteStore(ARGS["path"])
    await store.connect()
    version = await store.protocol_version()
    await store.close()
    emit({"side": "cairnqd", "protocol_version": version})
asyncio.run(main())
"""

THEIRS_SQLITE_CONNECT = """
import asyncio
import cairnq
async def main():
    barrier()
    store = cairnq.SQLiteStore(ARGS["path"])
    await store.connect()
    version = await store.protocol_version()
    await store.close()
    emit({"side": "cairnq " + cairnq.__version__, "protocol_version": version})
asyncio.run(main())
"""


def _assert_fully_migrated_once(dialect: str, target: str) -> None:
    assert sorted(ledger(dialect, target)) == list(upstream_migrations(dialect))
    assert sorted(ledger(dialect, target, "cairnqd_migrations")) == list(
        extension_migrations(dialect)
    )
    assert meta(dialect, target) == {"protocol_version": "1", "schema_version": "10"}


@pytest.mark.parametrize(
    "mix",
    [("ours", "ours", "ours", "ours"), ("theirs", "ours", "theirs", "ours")],
    ids=["4-cairnqd", "2-cairnq-2-cairnqd"],
)
def test_sqlite_concurrent_cold_start(tmp_path: Path, mix: tuple[str, ...]) -> None:
    path = str(tmp_path / "cold.db")
    scripts = [OURS_SQLITE_CONNECT if m == "ours" else THEIRS_SQLITE_CONNECT for m in mix]
    results = run_together(scripts, [{"path": path}] * len(mix), tmp_path / "barrier")
    for r in results:
        assert r.returncode == 0, r.stderr
        assert r.result["protocol_version"] == 1
    sides = sorted(r.result["side"] for r in results)
    if "theirs" in mix:
        assert sides == ["cairnq 0.15.1", "cairnq 0.15.1", "cairnqd", "cairnqd"]
    _assert_fully_migrated_once("sqlite", path)
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("pragma journal_mode").fetchone()[0] == "wal"
        assert conn.execute("pragma integrity_check").fetchone()[0] == "ok"


@pytest.mark.parametrize("attempt", range(3))
async def test_postgres_concurrent_cold_start(pg_dsn: str, attempt: int) -> None:
    stores = [PostgresStore(pg_dsn, max_size=2) for _ in range(4)]
    try:
        outcomes = await asyncio.gather(*(s.connect() for s in stores), return_exceptions=True)
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        assert not failures, f"{len(failures)} of 4 concurrent connects failed: {failures[0]!r}"
        assert [await s.protocol_version() for s in stores] == [1, 1, 1, 1]
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    _assert_fully_migrated_once("postgres", pg_dsn)


# cairnq 0.15.1 runs `create table if not exists cairnq_migrations` outside any lock, so
# on a cold Postgres database its own connect can lose the catalog race. An application
# retries that; the test does too, for their side only.
_UPSTREAM_COLD_START_RACE = (
    asyncpg.exceptions.UniqueViolationError,
    asyncpg.exceptions.DuplicateObjectError,
    asyncpg.exceptions.DuplicateTableError,
)


async def _their_connect(store: Any) -> None:
    try:
        await connect_upstream(store)
    except _UPSTREAM_COLD_START_RACE:
        await connect_upstream(store)


async def test_postgres_mixed_concurrent_cold_start(pg_dsn: str) -> None:
    ours = [PostgresStore(pg_dsn, max_size=2) for _ in range(2)]
    theirs = [cairnq.PostgresStore(pg_url(pg_dsn), max_size=2) for _ in range(2)]
    try:
        outcomes = await asyncio.gather(
            ours[0].connect(),
            _their_connect(theirs[0]),
            ours[1].connect(),
            _their_connect(theirs[1]),
            return_exceptions=True,
        )
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        assert not failures, f"concurrent connects failed: {failures!r}"
        for s in (*ours, *theirs):
            assert await s.protocol_version() == 1
    finally:
        await asyncio.gather(*(s.close() for s in (*ours, *theirs)))
    _assert_fully_migrated_once("postgres", pg_dsn)


# -- upgrading a database made by the public cairnq 0.2.0 --------------------------------

LEGACY_020 = """
import asyncio
import cairnq

async def main():
    if ARGS["dialect"] == "sqlite":
        client = cairnq.CairnQ.sqlite(ARGS["target"])
    else:
        client = cairnq.CairnQ.postgres(ARGS["url"])
    await client.connect()
    try:
        keyed = await client.submit(
            "legacy.keyed", {"n": 1, "text": "caf\\u00e9"}, key="legacy-key"
        )
        hot = await client.submit("legacy.hot", {"n": 2, "nested": [1, {"a": None}]}, priority=5)
        other = await client.submit("legacy.other", {"n": 3}, queue="other", max_attempts=5)
        done = await client.submit("legacy.done", {"n": 4}, queue="done")
        running = await client.store.claim(
            queues=["default"], worker_id="worker-legacy", lease_ms=600000
        )
        finished = await client.store.claim(
            queues=["done"], worker_id="worker-legacy", lease_ms=600000
        )
        await client.store.complete(
            task_id=finished[0].id, worker_id="worker-legacy", result={"ok": True}
        )
        tasks = {}
        for label, task in [("keyed", keyed), ("hot", hot), ("other", other), ("done", done)]:
            row = await client.get(task.id)
            tasks[label] = {
                "id": row.id, "name": row.name, "queue": row.queue, "status": row.status,
                "payload": row.payload, "result": row.result, "attempt": row.attempt,
                "max_attempts": row.max_attempts, "priority": row.priority,
                "worker_id": row.worker_id,
            }
        emit({
            "version": cairnq.__version__,
            "file": cairnq.__file__,
            "running": [t.id for t in running],
            "tasks": tasks,
        })
    finally:
        await client.close()
asyncio.run(main())
"""


async def test_upgrade_from_cairnq_0_2_0(cairnq_020: Path, dialect: str, db_target: str) -> None:
    made = run_script(
        LEGACY_020,
        {
            "dialect": dialect,
            "target": db_target,
            "url": pg_url(db_target) if dialect == "postgres" else "",
        },
        pythonpath=str(cairnq_020),
    )
    legacy = made.result
    assert legacy["version"] == "0.2.0"
    assert legacy["file"].startswith(str(cairnq_020))
    tasks = legacy["tasks"]
    assert legacy["running"] == [tasks["hot"]["id"]], "0.2.0 claims by priority first"
    assert tasks["hot"]["status"] == "running"
    assert tasks["done"]["status"] == "succeeded"

    # The seeds' era: only 0.2.0's own migrations are in the ledger.
    old_ledger = ledger(dialect, db_target)
    era = ["0001_init.sql", "0002_purge_index.sql"]
    if dialect == "postgres":
        era.append("0003_notify.sql")
    assert sorted(old_ledger) == era
    assert meta(dialect, db_target)["schema_version"] == "2"

    store = make_store(dialect, db_target)
    await store.connect()
    try:
        upgraded = ledger(dialect, db_target)
        assert sorted(upgraded) == list(upstream_migrations(dialect))
        assert {n: upgraded[n] for n in old_ledger} == old_ledger, "0.2.0's rows were rewritten"
        assert sorted(ledger(dialect, db_target, "cairnqd_migrations")) == list(
            extension_migrations(dialect)
        )
        assert meta(dialect, db_target) == {"protocol_version": "1", "schema_version": "10"}

        for label, before in tasks.items():
            now = await store.get(before["id"])
            assert now is not None, label
            for field, value in before.items():
                assert getattr(now, field) == value, (label, field)
        keyed = await store.get_by_key("legacy-key")
        assert keyed is not None and keyed.id == tasks["keyed"]["id"]

        # The running task belongs to the 0.2.0 worker and can be settled by its id.
        hot = await store.complete(
            task_id=tasks["hot"]["id"], worker_id="worker-legacy", result={"upgraded": True}
        )
        assert hot.status == "succeeded"
        assert hot.result == {"upgraded": True}
        assert hot.lease_until_ms is None

        # The remaining queued work is claimable under the upgraded indexes.
        claimed = await store.claim(queues=["default", "other"], worker_id="w-new", limit=5)
        assert sorted(t.id for t in claimed) == sorted([tasks["keyed"]["id"], tasks["other"]["id"]])
        assert all(t.attempt == 1 for t in claimed)
    finally:
        await store.close()


# -- each side opens the other's database ------------------------------------------------


def _their_store(dialect: str, target: str) -> Any:
    if dialect == "sqlite":
        return cairnq.SQLiteStore(target)
    return cairnq.PostgresStore(pg_url(target), max_size=2)


async def test_database_made_by_cairnq_opens_in_cairnqd(dialect: str, db_target: str) -> None:
    theirs = await connect_upstream(_their_store(dialect, db_target))
    made = await theirs.submit(name="from.them", payload={"x": 1})
    await theirs.close()
    before = ledger(dialect, db_target)
    assert sorted(before) == list(upstream_migrations(dialect))
    assert ledger(dialect, db_target, "cairnqd_migrations") == {}

    ours = make_store(dialect, db_target)
    await ours.connect()
    try:
        assert ledger(dialect, db_target) == before, "a shared migration was re-applied"
        assert sorted(ledger(dialect, db_target, "cairnqd_migrations")) == list(
            extension_migrations(dialect)
        )
        assert meta(dialect, db_target) == {"protocol_version": "1", "schema_version": "10"}
        task = await ours.get(made.id)
        assert task is not None and task.payload == {"x": 1}
    finally:
        await ours.close()


async def test_database_made_by_cairnqd_opens_in_cairnq(dialect: str, db_target: str) -> None:
    ours = make_store(dialect, db_target)
    await ours.connect()
    made = await ours.submit(name="from.us", payload={"y": 2})
    await ours.close()
    shared = ledger(dialect, db_target)
    extension = ledger(dialect, db_target, "cairnqd_migrations")

    theirs = await connect_upstream(_their_store(dialect, db_target))
    try:
        assert ledger(dialect, db_target) == shared, "cairnq re-applied one of our migrations"
        assert ledger(dialect, db_target, "cairnqd_migrations") == extension
        assert meta(dialect, db_target) == {"protocol_version": "1", "schema_version": "10"}
        task = await theirs.get(made.id)
        assert task is not None and task.payload == {"y": 2}
    finally:
        await theirs.close()


# -- same schema objects as upstream -----------------------------------------------------


def _norm(sql: str) -> str:
    text = re.sub(r"\s+", " ", sql.lower()).strip()
    return re.sub(r"\s*([(),=])\s*", r"\1", text)


def _sqlite_schema(path: str) -> dict[str, Any]:
    """Everything about the upstream objects that the SQL text does not hide."""
    out: dict[str, Any] = {}
    with closing(sqlite3.connect(path)) as conn:
        tables = ["cairnq_tasks", "cairnq_task_keys", "cairnq_meta", "cairnq_migrations"]
        for table in tables:
            out[f"{table}.columns"] = conn.execute(f"pragma table_xinfo({table})").fetchall()
            out[f"{table}.fks"] = conn.execute(f"pragma foreign_key_list({table})").fetchall()
            indexes = sorted(
                row[1:]
                for row in conn.execute(f"pragma index_list({table})").fetchall()
                if not row[1].startswith("cairnqd_")
            )
            out[f"{table}.indexes"] = indexes
            for index in indexes:
                out[f"{index[0]}.keys"] = conn.execute(f"pragma index_xinfo({index[0]})").fetchall()
            create = conn.execute(
                "select sql from sqlite_master where type = 'table' and name = ?", (table,)
            ).fetchone()[0]
            out[f"{table}.checks"] = sorted(_checks(_norm(create)))
        for name, sql in conn.execute(
            "select name, sql from sqlite_master where type = 'index' and sql like '% where %'"
        ).fetchall():
            if not name.startswith("cairnqd_"):
                out[f"{name}.where"] = re.split(r"\bwhere\b", _norm(sql), maxsplit=1)[1]
    return out


def _checks(create: str) -> list[str]:
    """The bodies of each `check(...)` in a normalized CREATE TABLE."""
    found = []
    for match in re.finditer(r"check\(", create):
        depth, start = 1, match.end()
        for i in range(start, len(create)):
            depth += {"(": 1, ")": -1}.get(create[i], 0)
            if depth == 0:
                found.append(create[start:i])
                break
    return found


def _pg_schema(dsn: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with psycopg.connect(dsn) as conn:
        out["columns"] = conn.execute(
            """select table_name, ordinal_position, column_name, data_type, is_nullable,
                      column_default
               from information_schema.columns
               where table_schema = 'public' and table_name like 'cairnq%'
                 and table_name not like 'cairnqd%'
               order by table_name, ordinal_position"""
        ).fetchall()
        out["indexes"] = conn.execute(
            """select indexname, indexdef from pg_indexes
               where schemaname = 'public' and indexname not like 'cairnqd%'
               order by indexname"""
        ).fetchall()
        out["constraints"] = conn.execute(
            """select c.conrelid::regclass::text, c.contype, pg_get_constraintdef(c.oid)
               from pg_constraint c join pg_namespace n on n.oid = c.connamespace
               where n.nspname = 'public' and c.conrelid::regclass::text like 'cairnq%'
                 and c.conrelid::regclass::text not like 'cairnqd%'
               order by 1, 2, 3"""
        ).fetchall()
        out["triggers"] = conn.execute(
            """select tgname, pg_get_triggerdef(t.oid) from pg_trigger t
               where not tgisinternal and tgname not like 'cairnqd%' order by tgname"""
        ).fetchall()
        out["functions"] = conn.execute(
            """select p.proname, pg_get_function_result(p.oid), l.lanname
               from pg_proc p join pg_namespace n on n.oid = p.pronamespace
               join pg_language l on l.oid = p.prolang
               where n.nspname = 'public' and p.proname like 'cairnq%'
                 and p.proname not like 'cairnqd%'
               order by 1"""
        ).fetchall()
    return out


async def test_schema_matches_upstream(
    dialect: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if dialect == "sqlite":
        theirs_target, ours_target = str(tmp_path / "theirs.db"), str(tmp_path / "ours.db")
    else:
        dbs = request.getfixturevalue("pg_databases")
        theirs_target, ours_target = dbs.new(), dbs.new()
    theirs = await connect_upstream(_their_store(dialect, theirs_target))
    await theirs.close()
    ours = make_store(dialect, ours_target)
    await ours.connect()
    await ours.close()
    describe = _sqlite_schema if dialect == "sqlite" else _pg_schema
    expected, actual = describe(theirs_target), describe(ours_target)
    assert expected.keys() == actual.keys()
    for key in expected:
        assert actual[key] == expected[key], key


# -- guards ------------------------------------------------------------------------------


@pytest.mark.parametrize("stored", ["2", None], ids=["version-2", "row-missing"])
async def test_protocol_version_mismatch(dialect: str, db_target: str, stored: str | None) -> None:
    first = make_store(dialect, db_target)
    await first.connect()
    await first.close()
    if stored is None:
        query(dialect, db_target, "delete from cairnq_meta where key = 'protocol_version'")
    else:
        query(
            dialect,
            db_target,
            "update cairnq_meta set value = ? where key = 'protocol_version'",
            [stored],
        )
    second = make_store(dialect, db_target)
    try:
        with pytest.raises(ProtocolVersionMismatch) as info:
            await second.connect()
    finally:
        await second.close()
    assert f"protocol_version={stored or 0}" in str(info.value)


@pytest.mark.parametrize(
    "content",
    [os.urandom(8192), b"this is a plain text file, not a database\n" * 200, b"x" * 10],
    ids=["random-bytes", "text", "tiny-text"],
)
async def test_not_a_sqlite_database(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    before = sorted(p.name for p in tmp_path.iterdir())
    mtime = path.stat().st_mtime_ns
    store = SQLiteStore(path)
    try:
        with pytest.raises(NotACairnqDatabase) as info:
            await store.connect()
    finally:
        await store.close()
    assert str(path) in str(info.value)
    assert path.read_bytes() == content, "the foreign file was modified"
    assert path.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "files were left beside it"


@pytest.mark.timing
@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://alice:s3cret-pw@127.0.0.1:1/cairnq",
        "host=127.0.0.1 port=1 user=alice password=s3cret-pw dbname=cairnq",
    ],
    ids=["url", "keywords"],
)
async def test_unreachable_postgres(dsn: str) -> None:
    store = PostgresStore(dsn, connect_timeout_s=3)
    started = time.monotonic()
    try:
        with pytest.raises(DatabaseUnavailable) as info:
            await store.connect()
    finally:
        await store.close()
    assert time.monotonic() - started < 5, "an unreachable server must fail fast"
    message = str(info.value)
    assert "s3cret-pw" not in message
    assert dsn.replace("s3cret-pw", "***") in message, message


async def test_postgres_schema_guard(pg_dsn: str) -> None:
    elsewhere = PostgresStore(pg_dsn, schema="other")
    await elsewhere.connect()
    made = await elsewhere.submit(name="in.other")
    await elsewhere.close()
    where = query(
        "postgres",
        pg_dsn,
        """select n.nspname from pg_class c join pg_namespace n on n.oid = c.relnamespace
           where c.relname = 'cairnq_tasks' and c.relkind = 'r'""",
    )
    assert where == [("other",)]

    default = PostgresStore(pg_dsn)
    try:
        with pytest.raises(SchemaMismatch) as info:
            await default.connect()
    finally:
        await default.close()
    assert "other" in str(info.value)
    # The refusal came before any migration: no second installation in public.
    assert scalar("postgres", pg_dsn, "select to_regclass('public.cairnq_tasks') is null")
    assert scalar("postgres", pg_dsn, "select to_regclass('public.cairnq_migrations') is null")

    configured = PostgresStore(pg_dsn, schema="other")
    await configured.connect()
    try:
        task = await configured.get(made.id)
        assert task is not None and task.name == "in.other"
    finally:
        await configured.close()


async def test_postgres_schema_option_agrees_with_cairnq(pg_dsn: str) -> None:
    ours = PostgresStore(pg_dsn, schema="Tenant_A")
    await ours.connect()
    made = await ours.submit(name="mixed.case")
    await ours.close()
    theirs = await connect_upstream(
        cairnq.PostgresStore(pg_url(pg_dsn), schema="Tenant_A", max_size=2)
    )
    try:
        task = await theirs.get(made.id)
        assert task is not None and task.name == "mixed.case"
    finally:
        await theirs.close()
    assert (
        scalar(
            "postgres",
            pg_dsn,
            """select count(*) from pg_class c join pg_namespace n on n.oid = c.relnamespace
           where c.relname = 'cairnq_tasks' and n.nspname = 'Tenant_A'""",
        )
        == 1
    )
