"""The test databases: a real SQLite file per test, a real Postgres database per test.

Postgres tests run against `CAIRNQD_TEST_PG_DSN` (default: the local server). When
the server is unreachable they skip, unless `CAIRNQD_REQUIRE_PG=1` (CI sets it), in
which case they fail: CI must never pass by skipping Postgres.

A pytest plugin (tests/conftest.py registers it): the fixtures below reach every test,
and the helpers (`make_store`, `require_postgres`, `PgDatabases`) are imported from here.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

from cairnqd.store.base import TaskStore
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore

PG_DSN = os.environ.get("CAIRNQD_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
REQUIRE_PG = os.environ.get("CAIRNQD_REQUIRE_PG") == "1"


def _pg_reachable() -> str | None:
    try:
        with psycopg.connect(PG_DSN, connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return str(exc)


_pg_problem: str | None = _pg_reachable()


def require_postgres() -> None:
    if _pg_problem is None:
        return
    message = f"Postgres unreachable at {PG_DSN}: {_pg_problem}"
    if REQUIRE_PG:
        pytest.fail(message)
    pytest.skip(message)


def dsn_for(database: str) -> str:
    return psycopg.conninfo.make_conninfo(PG_DSN, dbname=database)


class PgDatabases:
    """Creates throwaway databases and drops them when the test ends."""

    def __init__(self) -> None:
        self.created: list[str] = []

    def new(self) -> str:
        name = f"cairnqd_t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f'create database "{name}"')  # type: ignore[arg-type]
        self.created.append(name)
        return dsn_for(name)

    def drop_all(self) -> None:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            for name in self.created:
                conn.execute(f'drop database if exists "{name}" with (force)')  # type: ignore[arg-type]


@pytest.fixture
def pg_databases() -> Iterator[PgDatabases]:
    require_postgres()
    dbs = PgDatabases()
    try:
        yield dbs
    finally:
        dbs.drop_all()


@pytest.fixture
def pg_dsn(pg_databases: PgDatabases) -> str:
    """A fresh, empty Postgres database for this test."""
    return pg_databases.new()


@pytest.fixture
def sqlite_path(tmp_path: Path) -> str:
    return str(tmp_path / "tasks.db")


@pytest.fixture(params=["sqlite", "postgres"])
def dialect(request: pytest.FixtureRequest) -> str:
    if request.param == "postgres":
        require_postgres()
    return str(request.param)


@pytest.fixture
def db_target(dialect: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A path (SQLite) or DSN (Postgres) of a fresh database, per the `dialect` param."""
    if dialect == "sqlite":
        return str(tmp_path / "tasks.db")
    dbs: PgDatabases = request.getfixturevalue("pg_databases")
    return dbs.new()


def make_store(dialect: str, target: str) -> TaskStore:
    if dialect == "sqlite":
        return SQLiteStore(target)
    return PostgresStore(target, max_size=4)


@pytest.fixture
async def store(dialect: str, db_target: str) -> AsyncIterator[TaskStore]:
    s = make_store(dialect, db_target)
    await s.connect()
    try:
        yield s
    finally:
        await s.close()
