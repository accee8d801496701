"""store.errors: one classification of database errors for every caller above the store.

Real errors where they are cheap to provoke (a locked SQLite file, a Postgres statement
timeout, a refused connection), constructed ones for the rest.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import psycopg_pool
import pytest

from cairnqd.errors import DatabaseUnavailable, LostLease, StoreClosed
from cairnqd.store.errors import classify, is_transient, refused_login
from cairnqd.store.sqlite.errors import is_sqlite_busy
from tests.support.databases import require_postgres


def test_a_real_sqlite_busy_error_is_busy(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    holder = sqlite3.connect(path, isolation_level=None)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        holder.execute("create table t (x)")
        holder.execute("begin immediate")
        with pytest.raises(sqlite3.OperationalError) as info:
            other.execute("begin immediate")
        assert is_sqlite_busy(info.value)
        assert classify(info.value) == "busy"
        assert is_transient(info.value)
    finally:
        holder.close()
        other.close()


def test_a_real_full_sqlite_database_is_full_and_worth_retrying(tmp_path: Path) -> None:
    # SQLite's page limit raises the SQLITE_FULL a full disk does (tests/faults fills a
    # real disk); the write succeeds once there is room, so it is retried.
    conn = sqlite3.connect(tmp_path / "capped.db")
    try:
        conn.execute("create table t (x)")
        conn.execute("pragma max_page_count = 2")
        with pytest.raises(sqlite3.OperationalError) as info:
            conn.execute("insert into t values (zeroblob(100000))")
    finally:
        conn.close()
    assert "full" in str(info.value)
    assert classify(info.value) == "full"
    assert is_transient(info.value)


def test_sqlite_errors_by_kind(tmp_path: Path) -> None:
    # Raised without a result code (a test double): SQLite's wording decides.
    assert classify(sqlite3.OperationalError("database is locked")) == "busy"
    assert not is_sqlite_busy(sqlite3.OperationalError("database is locked"))
    missing = tmp_path / "no" / "such" / "dir" / "x.db"
    with pytest.raises(sqlite3.OperationalError) as info:
        sqlite3.connect(f"file:{missing}?mode=ro", uri=True).execute("select 1")
    assert classify(info.value) == "connect"
    conn = sqlite3.connect(":memory:")
    with pytest.raises(sqlite3.OperationalError) as no_table:
        conn.execute("select * from nowhere")
    assert classify(no_table.value) == "other"
    assert not is_transient(no_table.value)
    conn.execute("create table t (x unique)")
    conn.execute("insert into t values (1)")
    with pytest.raises(sqlite3.IntegrityError) as dup:
        conn.execute("insert into t values (1)")
    assert classify(dup.value) == "other"
    conn.close()


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (TimeoutError(), "timeout"),
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), "timeout"),
        (psycopg.errors.LockNotAvailable("lock timeout"), "timeout"),
        (psycopg_pool.PoolTimeout("couldn't get a connection"), "timeout"),
        (psycopg.errors.SerializationFailure("could not serialize"), "busy"),
        (psycopg.errors.DeadlockDetected("deadlock detected"), "busy"),
        (psycopg.OperationalError("server closed the connection unexpectedly"), "connect"),
        (psycopg.errors.AdminShutdown("terminating connection"), "connect"),
        (psycopg.errors.DiskFull("could not extend file"), "full"),
        (psycopg_pool.PoolClosed("the pool is closed"), "connect"),
        (DatabaseUnavailable("down"), "connect"),
        (ConnectionResetError(), "connect"),
        (psycopg.errors.UniqueViolation("duplicate key"), "other"),
        (psycopg.errors.InvalidTextRepresentation("bad json"), "other"),
        (LostLease("task_x"), "other"),
        (StoreClosed("closed"), "other"),
        (ValueError("x"), "other"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_kinds(exc: BaseException, kind: str) -> None:
    assert classify(exc) == kind
    assert is_transient(exc) is (kind != "other")


async def test_a_real_postgres_statement_timeout_is_a_timeout(pg_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute("set statement_timeout = 50")
        with pytest.raises(psycopg.Error) as info:
            await conn.execute("select pg_sleep(5)")
    assert classify(info.value) == "timeout"


async def test_a_refused_postgres_connection_is_connect() -> None:
    require_postgres()
    with pytest.raises(psycopg.OperationalError) as info:
        # Port 1 on loopback: nothing listens, the kernel refuses at once.
        await psycopg.AsyncConnection.connect("host=127.0.0.1 port=1", connect_timeout=3)
    assert classify(info.value) == "connect"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (
            'connection failed: connection to server at "10.0.0.5", port 5432 failed: '
            'FATAL:  database "shop" does not exist',
            'database "shop" does not exist',
        ),
        (
            'connection failed: ...: FATAL:  password authentication failed for user "app"',
            'password authentication failed for user "app"',
        ),
        (
            'connection failed: ...: FATAL:  no pg_hba.conf entry for host "10.0.0.9", '
            'user "app", database "shop", no encryption',
            'no pg_hba.conf entry for host "10.0.0.9", user "app", database "shop", no encryption',
        ),
        ("connection failed: ...: Connection refused\n\tIs the server running?", None),
        ("connection failed: ...: FATAL:  the database system is starting up", None),
        ("connection failed: ...: FATAL:  la base de données « shop » n'existe pas", None),
    ],
)
def test_a_login_refused_for_good_is_told_from_one_worth_retrying(
    message: str, reason: str | None
) -> None:
    """A missing database or role, or a failed authentication, fails the same way on
    every try; a server starting up or not listening may answer the next one."""
    wrapped = DatabaseUnavailable("cannot connect to Postgres")
    wrapped.__cause__ = psycopg.OperationalError(message)
    assert refused_login(wrapped) == reason
