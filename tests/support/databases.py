"""The test databases: a real SQLite file per test, a real Postgres database per test.

Postgres tests run against `CAIRNQD_TEST_PG_DSN` (default: the local server). When
the server is unreachable they skip, unless `CAIRNQD_REQUIRE_PG=1` (CI sets it), in
which case they fail: CI must never pass by skipping Postgres.

A pytest plugin (tests/conftest.py registers it): the fixtures below reach every test,
and the helpers (`make_store`, `require_postgres`, `PgDatabases`) are imported from here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

from cairnqd._protocol import Dialect, migrations
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


def schema_digest(dialect: Dialect) -> str:
    """A name for the schema this checkout's migrations build: it changes with any of them."""
    h = hashlib.sha256()
    for m in migrations(dialect):
        h.update(f"{m.ledger}/{m.name}\0{m.sql}\0".encode())
    return h.hexdigest()[:16]


#: Serializes the making of a template among the suite's parallel workers.
_TEMPLATE_LOCK = 0x6361_6972_6E71_7464 & 0x7FFF_FFFF_FFFF_FFFF


def _migrate(dialect: str, target: str) -> None:
    """Connect a store to `target` (which applies every migration), on a thread of its own:
    the caller may be inside a running event loop."""

    async def run() -> None:
        store = make_store(dialect, target)
        await store.connect()
        await store.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, run()).result()


def _pg_template() -> str:
    """A database migrated to this checkout's schema, made once and kept on the server
    (named by `schema_digest`, so a changed migration makes a new one); tests copy it
    instead of running every migration again. Templates of other schemas are dropped."""
    name = f"cairnqd_tpl_{schema_digest('postgres')}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute("select pg_advisory_lock(%s)", (_TEMPLATE_LOCK,))
        try:
            found = conn.execute(
                "select datname from pg_database where datname like 'cairnqd_tpl_%'"
            ).fetchall()
            names = {row[0] for row in found}
            for stale in names - {name}:
                conn.execute(f'drop database if exists "{stale}" with (force)')  # type: ignore[arg-type]
            if name not in names:
                building = f"{name}_building"
                conn.execute(f'drop database if exists "{building}" with (force)')  # type: ignore[arg-type]
                conn.execute(f'create database "{building}"')  # type: ignore[arg-type]
                _migrate("postgres", dsn_for(building))
                # Renamed only once whole: a run killed mid-way leaves no half template.
                conn.execute(f'alter database "{building}" rename to "{name}"')  # type: ignore[arg-type]
        finally:
            conn.execute("select pg_advisory_unlock(%s)", (_TEMPLATE_LOCK,))
    return name


_pg_template_name: str | None = None


class PgDatabases:
    """Creates throwaway databases and drops them when the test ends."""

    def __init__(self) -> None:
        self.created: list[str] = []

    def new(self, *, migrated: bool = False) -> str:
        """A fresh database: empty, or (`migrated`) a copy of this checkout's schema."""
        global _pg_template_name
        require_postgres()
        name = f"cairnqd_t_{uuid.uuid4().hex[:12]}"
        source = ""
        if migrated:
            if _pg_template_name is None:
                _pg_template_name = _pg_template()
            source = f' template "{_pg_template_name}"'
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f'create database "{name}"{source}')  # type: ignore[arg-type]
        self.created.append(name)
        return dsn_for(name)

    def drop_all(self) -> None:
        if not self.created:
            return
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            for name in self.created:
                conn.execute(f'drop database if exists "{name}" with (force)')  # type: ignore[arg-type]


@pytest.fixture
def pg_databases() -> Iterator[PgDatabases]:
    """Postgres databases made for the test, dropped when it ends. Requires a server
    only once one is made, so fixtures of both dialects may order themselves after it
    (`daemon_factory`)."""
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
def db_target(
    dialect: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> str:  # fmt: skip
    """A path (SQLite) or DSN (Postgres) of a fresh database, per the `dialect` param.

    Empty, unless the test also uses a `store` fixture: that store would migrate it before
    the test begins, so the test gets a copy of a template migrated once instead (the same
    schema, without running every migration again; its ledger's times are the template's).
    A test about migrating itself is marked `fresh_schema` and always starts empty."""
    migrated = (
        "store" in request.fixturenames and request.node.get_closest_marker("fresh_schema") is None
    )
    if dialect == "sqlite":
        path = tmp_path / "tasks.db"
        if migrated:
            shutil.copyfile(_sqlite_template(tmp_path_factory.getbasetemp()), path)
        return str(path)
    dbs: PgDatabases = request.getfixturevalue("pg_databases")
    return dbs.new(migrated=migrated)


def make_store(dialect: str, target: str) -> TaskStore:
    if dialect == "sqlite":
        return SQLiteStore(target)
    return PostgresStore(target, max_size=4)


def _sqlite_template(folder: Path) -> Path:
    path = folder / f"cairnqd-template-{schema_digest('sqlite')}.db"
    if not path.exists():
        building = folder / f"{path.name}.{os.getpid()}"
        _migrate("sqlite", str(building))
        os.replace(building, path)
    return path


@pytest.fixture
async def store(dialect: str, db_target: str) -> AsyncIterator[TaskStore]:
    s = make_store(dialect, db_target)
    await s.connect()
    try:
        yield s
    finally:
        await s.close()
