"""store.factory: one place that turns a database config into a store for a purpose."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from cairnqd.config import DatabaseConfig
from cairnqd.store.factory import build_store, store_for
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore


def database(*, path: str | None = None, dsn: str | None = None) -> DatabaseConfig:
    return DatabaseConfig(
        path=path,
        dsn=dsn,
        dsn_file=None,
        connect_timeout=timedelta(seconds=7),
        busy_timeout=timedelta(seconds=3),
        connections_per_child=4,
        expected_hosts=1,
        connection_check="refuse",
        auto_migrate=False,
        lock_namespace=1,
    )


@pytest.mark.parametrize("purpose", ["worker", "background", "cli"])
def test_sqlite_for_every_purpose(sqlite_path: str, purpose: str) -> None:
    store = store_for(database(path=sqlite_path), purpose)  # type: ignore[arg-type]
    assert isinstance(store, SQLiteStore)
    assert store.path == sqlite_path
    assert store.busy_timeout_ms == 3000
    assert store.migrate is False


def test_sqlite_statement_timeout_shortens_the_busy_wait(sqlite_path: str) -> None:
    store = store_for(database(path=sqlite_path), "background", statement_timeout_ms=2000)
    assert isinstance(store, SQLiteStore) and store.busy_timeout_ms == 2000
    longer = store_for(database(path=sqlite_path), "background", statement_timeout_ms=9000)
    assert isinstance(longer, SQLiteStore) and longer.busy_timeout_ms == 3000


def test_cli_may_override_auto_migrate(sqlite_path: str) -> None:
    store = store_for(database(path=sqlite_path), "cli", migrate=True)
    assert isinstance(store, SQLiteStore) and store.migrate is True


@pytest.mark.parametrize(
    ("purpose", "max_size", "listen"),
    [("worker", 4, True), ("background", 1, False), ("cli", 1, False)],
)
def test_postgres_shape_per_purpose(purpose: str, max_size: int, listen: bool) -> None:
    dsn = "postgresql://u@db.example/app"
    store = store_for(database(dsn=dsn), purpose)  # type: ignore[arg-type]
    assert isinstance(store, PostgresStore)
    assert (store.min_size, store.max_size, store.listen) == (1, max_size, listen)
    assert store.connect_timeout_s == 7
    assert store.migrate is False
    assert store.dsn == dsn


async def test_postgres_statement_timeout_reaches_the_server(pg_dsn: str) -> None:
    store = store_for(database(dsn=pg_dsn), "background", statement_timeout_ms=1234, migrate=True)
    async with store:
        assert isinstance(store, PostgresStore) and store._pool is not None
        async with store._pool.connection() as conn:
            row = await (await conn.execute("show statement_timeout")).fetchone()
    assert row is not None and row["statement_timeout"] == "1234ms"


def test_postgres_statement_timeout_keeps_the_operators_options() -> None:
    dsn = "host=db.example dbname=app options='-c search_path=tenant'"
    store = build_store("background", dsn=dsn, statement_timeout_ms=500)
    assert isinstance(store, PostgresStore)
    options = psycopg.conninfo.conninfo_to_dict(store.conninfo)["options"]
    assert options == "-c search_path=tenant -c statement_timeout=500"
    assert "statement_timeout" not in store.dsn


def test_build_store_refuses_ambiguous_targets(sqlite_path: str) -> None:
    with pytest.raises(ValueError, match="exactly one of path"):
        build_store("worker")
    with pytest.raises(ValueError, match="exactly one of path"):
        build_store("worker", path=sqlite_path, dsn="host=x")
    with pytest.raises(ValueError, match="purpose"):
        build_store("daemon", path=sqlite_path)  # type: ignore[arg-type]


def test_a_worker_pool_has_at_least_one_connection() -> None:
    store = build_store("worker", dsn="host=db.example", connections=0)
    assert isinstance(store, PostgresStore) and store.max_size == 1


async def test_sqlite_has_no_server_connection_limits(sqlite_path: str) -> None:
    assert (
        await store_for(database(path=sqlite_path), "background").server_connection_limits() is None
    )
