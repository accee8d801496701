"""`tx=` with what applications hold: SQLAlchemy 2 (sync `Session` on both dialects,
`AsyncSession` over psycopg), Django's connection inside `transaction.atomic()` (in a
process of its own, configured as a Django project would be), and the sync entry
point `submit_sync` that script and Django code calls.

The raw drivers' semantics are tests/store/test_caller_tx.py.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from cairnqd import AlreadyExists, CairnQ
from cairnqd.store.base import TaskStore
from tests.support.cli import REPO
from tests.support.databases import PgDatabases, make_store
from tests.support.store import pg_url, query, scalar


@pytest.fixture
async def client(store: TaskStore) -> AsyncIterator[CairnQ]:
    yield CairnQ(store)


def url(dialect: str, target: str, *, driver: str = "psycopg") -> str:
    if dialect == "sqlite":
        return f"sqlite:///{target}"
    return pg_url(target).replace("postgresql://", f"postgresql+{driver}://", 1)


def count(dialect: str, target: str, table: str = "cairnq_tasks") -> int:
    return int(scalar(dialect, target, f"select count(*) from {table}"))


def orders_table(dialect: str, target: str) -> None:
    engine = sa.create_engine(url(dialect, target))
    with engine.begin() as conn:
        conn.execute(sa.text("create table if not exists orders (id integer primary key)"))
    engine.dispose()


async def test_a_sqlalchemy_session_commits_the_task_with_the_order(
    client: CairnQ, dialect: str, db_target: str
) -> None:
    orders_table(dialect, db_target)
    engine = sa.create_engine(url(dialect, db_target))
    try:
        with Session(engine) as session, session.begin():
            session.execute(sa.text("insert into orders (id) values (1)"))
            task = client.submit_sync("receipt.send", {"order": 1}, key="r-1", tx=session)
            assert await client.get(task.id) is None
        assert (await client.get(task.id)) is not None
        with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
            session.execute(sa.text("insert into orders (id) values (2)"))
            client.submit_many_sync(
                [{"name": "receipt.send", "payload": 2}, {"name": "x", "key": "r-2"}], tx=session
            )
            raise RuntimeError("declined")
        assert count(dialect, db_target) == 1
        assert count(dialect, db_target, "cairnq_task_keys") == 1
        assert count(dialect, db_target, "orders") == 1
        # A Connection works as the Session does; a reject raises inside it.
        with engine.connect() as conn:
            with pytest.raises(AlreadyExists):
                client.submit_sync("receipt.send", key="r-1", conflict="reject", tx=conn)
            conn.execute(sa.text("insert into orders (id) values (3)"))
            conn.commit()
        assert count(dialect, db_target, "orders") == 2
    finally:
        engine.dispose()


@pytest.fixture
async def pg_client(pg_databases: PgDatabases) -> AsyncIterator[tuple[CairnQ, str]]:
    """A client on a fresh, migrated Postgres database, and its DSN."""
    target = pg_databases.new()
    store = make_store("postgres", target)
    await store.connect()
    try:
        yield CairnQ(store), target
    finally:
        await store.close()


@pytest.mark.postgres
async def test_a_sqlalchemy_async_session_over_psycopg(pg_client: tuple[CairnQ, str]) -> None:
    client, target = pg_client
    orders_table("postgres", target)
    engine = create_async_engine(url("postgres", target))
    try:
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(sa.text("insert into orders (id) values (1)"))
            task = await client.submit("receipt.send", {"order": 1}, tx=session)
            assert await client.get(task.id) is None
        assert (await client.get(task.id)) is not None
        async with AsyncSession(engine) as session, session.begin():
            await client.submit("receipt.send", {"order": 2}, tx=session)
            await session.rollback()
        assert count("postgres", target) == 1
        # An asyncio connection in the sync entry point is named, not hung on.
        async with engine.connect() as conn:
            with pytest.raises(TypeError, match="use `await submit"):
                client.submit_sync("receipt.send", tx=conn)
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_asyncpg_under_sqlalchemy_is_refused_by_name(pg_client: tuple[CairnQ, str]) -> None:
    client, target = pg_client
    engine = create_async_engine(url("postgres", target, driver="asyncpg"))
    try:
        async with AsyncSession(engine) as session, session.begin():
            with pytest.raises(TypeError, match=r"psycopg AsyncConnection or Connection; got"):
                await client.submit("receipt.send", tx=session)
    finally:
        await engine.dispose()
    assert count("postgres", target) == 0


async def test_submit_sync_with_the_raw_drivers(
    client: CairnQ, dialect: str, db_target: str
) -> None:
    orders_table(dialect, db_target)
    if dialect == "sqlite":
        conn: Any = sqlite3.connect(db_target)
    else:
        conn = psycopg.connect(db_target)
    try:
        conn.execute("insert into orders (id) values (4)")
        task = client.submit_sync("receipt.send", 4, tx=conn)
        assert await client.get(task.id) is None
        conn.commit()
        assert (await client.get(task.id)) is not None
        client.submit_sync("receipt.send", 5, tx=conn)
        conn.rollback()
        assert count(dialect, db_target) == 1
    finally:
        conn.close()
    with pytest.raises(TypeError, match="needs tx="):
        client.submit_sync("receipt.send", tx=None)


DJANGO_PROJECT = """
import sys

import django
from django.conf import settings
from django.db import connection, transaction

from cairnqd import CairnQ

dialect, target, django_db = sys.argv[1], sys.argv[2], eval(sys.argv[3])
settings.configure(DATABASES={"default": django_db}, USE_TZ=True)
django.setup()
client = CairnQ.sqlite(target) if dialect == "sqlite" else CairnQ.postgres(target)

with connection.cursor() as cursor:
    cursor.execute("create table if not exists orders (id integer primary key)")

with transaction.atomic():
    with connection.cursor() as cursor:
        cursor.execute("insert into orders (id) values (1)")
    kept = client.submit_sync("receipt.send", {"order": 1}, key="django-1", tx=connection)

try:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("insert into orders (id) values (2)")
        client.submit_sync("receipt.send", {"order": 2}, key="django-2", tx=connection)
        raise RuntimeError("declined")
except RuntimeError:
    pass

# Outside atomic (Django's autocommit): the submit commits by itself.
alone = client.submit_sync("receipt.send", {"order": 3}, tx=connection)
print(kept.id, alone.id)
"""


async def test_django_atomic_blocks_carry_the_task(
    dialect: str, db_target: str, store: TaskStore
) -> None:
    del store  # migrated: the tables exist before Django's process writes through them
    if dialect == "sqlite":
        django_db: dict[str, Any] = {"ENGINE": "django.db.backends.sqlite3", "NAME": db_target}
    else:
        info = psycopg.conninfo.conninfo_to_dict(db_target)
        django_db = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": info["dbname"],
            "HOST": info.get("host", ""),
            "PORT": info.get("port", ""),
            "USER": info.get("user", ""),
        }
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            DJANGO_PROJECT,
            dialect,
            db_target,
            repr(django_db),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    kept, alone = done.stdout.split()
    ids = {row for (row,) in query(dialect, db_target, "select id from cairnq_tasks")}
    assert ids == {kept, alone}
    assert count(dialect, db_target, "orders") == 1
    keys = {row for (row,) in query(dialect, db_target, "select key from cairnq_task_keys")}
    assert keys == {"django-1"}


async def test_aiosqlite_under_sqlalchemy_is_refused_by_name(tmp_path: Any) -> None:
    target = str(tmp_path / "tasks.db")
    store = make_store("sqlite", target)
    await store.connect()
    engine = create_async_engine(f"sqlite+aiosqlite:///{target}")
    try:
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(sa.text("select 1"))
            with pytest.raises(TypeError, match=r"sqlite3\.Connection on .*; got a aiosqlite"):
                await CairnQ(store).submit("receipt.send", tx=session)
    finally:
        await engine.dispose()
        await store.close()
    assert count("sqlite", target) == 0
