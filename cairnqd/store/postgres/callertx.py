"""Writing through the caller's own psycopg connection (`submit(tx=conn)`).

A psycopg 3 `AsyncConnection` or `Connection` is accepted, inside a transaction or
not. The task commits or rolls back with the caller's transaction: the NOTIFY that
wakes workers is sent by a trigger, so it reaches them only when the caller commits.
Nothing here commits, rolls back or closes what the caller opened. Statements that
must land together (a keyed submit, `submit_many`) run under a savepoint, so a
failure among them (a `reject` conflict) undoes only them. A connection in autocommit
mode outside a transaction has nothing to join: the submit is a transaction of its
own. A sync `Connection` blocks the event loop for its statements, as it would for
the caller's own.

The connection must reach this store's database: the same server (its start time),
database and `cairnq_tasks` table, checked once per connection.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, tuple_row

from cairnqd._protocol import Statement, statement
from cairnqd.store.base import Clock, Params, Row
from cairnqd.store.executor import Session, unsupported_tx
from cairnqd.store.postgres.connect import bind, returned_rows

#: What names a database install: the server's start, the database, the task table.
IDENTITY_SQL = (
    "select pg_postmaster_start_time()::text as started, current_database() as database, "
    "to_regclass('cairnq_tasks')::oid::bigint as tasks"
)
Identity = tuple[Any, ...]
_SAVEPOINT = "cairnq_submit"

#: Connections already found to reach the store's database, per store identity.
_checked: weakref.WeakKeyDictionary[Any, Identity] = weakref.WeakKeyDictionary()


class _AsyncSession:
    def __init__(self, conn: psycopg.AsyncConnection[Any], clock: Clock | None) -> None:
        self._conn, self._clock = conn, clock

    async def fetch(
        self, op: str, params: Params, supplied: frozenset[str] = frozenset()
    ) -> list[Row]:
        return await self.fetch_statement(statement("postgres", op, supplied), params)

    async def fetch_statement(self, stmt: Statement, params: Params) -> list[Row]:
        async with self._conn.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(stmt.text, bind(stmt, params, self._clock))
            return list(await cursor.fetchall()) if returned_rows(cursor) else []

    async def execute(self, sql: str) -> None:
        await self._conn.execute(sql)


class _SyncSession:
    def __init__(self, conn: psycopg.Connection[Any], clock: Clock | None) -> None:
        self._conn, self._clock = conn, clock

    async def fetch(
        self, op: str, params: Params, supplied: frozenset[str] = frozenset()
    ) -> list[Row]:
        return await self.fetch_statement(statement("postgres", op, supplied), params)

    async def fetch_statement(self, stmt: Statement, params: Params) -> list[Row]:
        with self._conn.cursor(row_factory=dict_row) as cursor:
            cursor.execute(stmt.text, bind(stmt, params, self._clock))
            return list(cursor.fetchall()) if returned_rows(cursor) else []

    async def execute(self, sql: str) -> None:
        self._conn.execute(sql)


def _state(conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any]) -> None:
    if conn.closed:
        raise ValueError("tx= is a closed psycopg connection")
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise ValueError(
            "tx= is in a failed transaction (a statement in it raised): roll it back "
            "before submitting through it"
        )
    if status == TransactionStatus.ACTIVE:
        raise ValueError("tx= is busy running another statement (a COPY or a query in progress)")


async def plain_session(
    tx: object, identity: Callable[[], Awaitable[Identity]] | None, clock: Clock | None
) -> _AsyncSession | _SyncSession:
    """`tx` as a session for one statement, atomic by itself (in autocommit mode outside
    a transaction it commits on its own), once `tx` is found fit to write through.
    `identity` None: `tx` is one of the store's own connections (`succeed_in`'s), whose
    database needs no check (nor another pool connection to make it with)."""
    if isinstance(tx, psycopg.AsyncConnection):
        session: _AsyncSession | _SyncSession = _AsyncSession(tx, clock)
    elif isinstance(tx, psycopg.Connection):
        session = _SyncSession(tx, clock)
    else:
        raise unsupported_tx(tx, "a psycopg AsyncConnection or Connection")
    _state(tx)
    if identity is not None:
        await _check_database(tx, session, identity)
    return session


@asynccontextmanager
async def caller_session(
    tx: object, identity: Callable[[], Awaitable[Identity]] | None, clock: Clock | None
) -> AsyncIterator[Session]:
    """`tx` as a session for statements that must land together: under a savepoint in
    the caller's transaction (psycopg opens one before the first statement of a
    connection outside autocommit), or in a transaction of their own in autocommit."""
    session = await plain_session(tx, identity, clock)
    conn: Any = tx
    if conn.info.transaction_status == TransactionStatus.IDLE and conn.autocommit:
        await session.execute("begin")
        try:
            yield session
        except BaseException:
            await session.execute("rollback")
            raise
        await session.execute("commit")
        return
    await session.execute(f"savepoint {_SAVEPOINT}")
    try:
        yield session
    except BaseException:
        await session.execute(f"rollback to savepoint {_SAVEPOINT}")
        await session.execute(f"release savepoint {_SAVEPOINT}")
        raise
    await session.execute(f"release savepoint {_SAVEPOINT}")


async def _check_database(
    tx: Any, session: _AsyncSession | _SyncSession, identity: Callable[[], Awaitable[Identity]]
) -> None:
    ours = await identity()
    if _checked.get(tx) == ours:
        return
    if isinstance(session, _AsyncSession):
        async with tx.cursor(row_factory=tuple_row) as cursor:
            await cursor.execute(IDENTITY_SQL)
            row = await cursor.fetchone()
    else:
        with tx.cursor(row_factory=tuple_row) as cursor:
            row = cursor.execute(IDENTITY_SQL).fetchone()
    theirs = tuple(row) if row is not None else ()
    if theirs != ours:
        where = f"database {theirs[1]!r}" if len(theirs) > 1 else "another database"
        if len(theirs) > 2 and theirs[2] is None:
            where += " (no cairnq_tasks table on its search_path)"
        raise ValueError(
            f"tx= is a connection to {where}, not this store's database "
            f"{ours[1]!r}: the task would not commit with your work"
        )
    _checked[tx] = ours


async def store_identity(conn: psycopg.AsyncConnection[Any]) -> Identity:
    """The identity of the database `conn` (one of the store's) reaches."""
    async with conn.cursor(row_factory=tuple_row) as cursor:
        await cursor.execute(IDENTITY_SQL)
        row = await cursor.fetchone()
    assert row is not None
    return tuple(row)


def identity_now(dsn: str, *, schema: str | None, **connect: Any) -> Identity:
    """The identity of the store's database read on a sync connection of its own:
    for a sync submit, which runs without an event loop."""
    with psycopg.connect(dsn, autocommit=True, **connect) as conn:
        if schema is not None:
            conn.execute(sql.SQL("set search_path to {}").format(sql.Identifier(schema)))
        with conn.cursor(row_factory=tuple_row) as cursor:
            row = cursor.execute(IDENTITY_SQL).fetchone()
    assert row is not None
    return tuple(row)
