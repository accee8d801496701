"""Postgres plumbing shared by the store, its listeners and the leadership sessions:
what a connection is opened with (keepalives, `tcp_user_timeout`), how one protocol
statement runs on it, and the detection bound for a dead connection
(docs/architecture.md, "Silent network partitions").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Mapping
from typing import Any

import psycopg
from psycopg import pq

from cairnqd._protocol import Statement
from cairnqd.store.base import Clock, Row

# Kept in a driver-free module, so a SQLite daemon uses them without loading psycopg;
# named here too, beside the connection settings they bound.
from cairnqd.store.reachability import CANCEL_GRACE_S as CANCEL_GRACE_S
from cairnqd.store.reachability import DAEMON_CALL_TIMEOUT_S as DAEMON_CALL_TIMEOUT_S
from cairnqd.store.reachability import DETECTION_BOUND_S as DETECTION_BOUND_S
from cairnqd.store.reachability import Reachability as Reachability
from cairnqd.store.reachability import is_unreachable as is_unreachable

AsyncConn = psycopg.AsyncConnection[dict[str, Any]]


#: libpq parameters every connection gets unless its DSN sets them (see above).
KEEPALIVES: dict[str, str] = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "25000",
}

#: What may sit between a store and Postgres (`database.pooler`).
POOLERS = ("none", "session", "transaction")


def check_pooler(pooler: str) -> str:
    if pooler not in POOLERS:
        raise ValueError(f"pooler must be one of {', '.join(POOLERS)}; got {pooler!r}")
    return pooler


def connect_kwargs(pooler: str) -> dict[str, Any]:
    """psycopg connection arguments for a connection through `pooler`.

    Behind a pooler, server connections are shared, so psycopg's server-side prepared
    statements (`_pg3_0`, ...) would meet another client's under the same name: the
    server answers "already exists", "does not exist", or runs the other statement
    when the parameter counts match. `prepare_threshold=None` never prepares."""
    return {} if pooler == "none" else {"prepare_threshold": None}


def session_conninfo(
    dsn: str,
    *,
    statement_timeout_ms: int | None = None,
    connect_timeout_s: float | None = None,
    pooler: str = "none",
) -> str:
    """The conninfo every connection of a store is opened with: the operator's DSN,
    the keepalive settings it does not set itself, and the store's session settings.

    `connect_timeout_s` goes in too unless the DSN sets one: the pool and the LISTEN
    sessions open connections from the conninfo alone, and psycopg's default (130 s)
    would leave a reconnect hanging that long on a connection a partition swallowed.

    Behind a pooler (`pooler` other than none) no startup `options` are added: PgBouncer
    refuses the parameter (in session mode too), and session settings would not follow
    a transaction onto its next server connection anyway. The store then bounds its
    statements with `SET LOCAL` inside each transaction instead."""
    given = psycopg.conninfo.conninfo_to_dict(dsn)
    extra: dict[str, Any] = {k: v for k, v in KEEPALIVES.items() if k not in given}
    if connect_timeout_s is not None and "connect_timeout" not in given:
        # libpq counts whole seconds, at least 2.
        extra["connect_timeout"] = str(max(2, round(connect_timeout_s)))
    if statement_timeout_ms is not None and check_pooler(pooler) == "none":
        # Appended to any `options` the operator set, so theirs still apply.
        options = f"{given.get('options') or ''} -c statement_timeout={int(statement_timeout_ms)}"
        extra["options"] = options.strip()
    return psycopg.conninfo.make_conninfo(dsn, **extra)


def bind(stmt: Statement, params: Mapping[str, Any], clock: Clock | None = None) -> dict[str, Any]:
    """The values `stmt` names, from a superset of parameters. A statement that names
    `now_ms` reads the server clock when it is bound NULL, `clock` when one is given."""
    bound = {name: params.get(name) for name in stmt.params}
    if "running" in bound:
        bound["running"] = "running"
    if clock is not None and "now_ms" in bound:
        bound["now_ms"] = clock()
    return bound


#: The result statuses that carry rows (psycopg's own test for a cursor's description;
#: TUPLES_CHUNK exists from psycopg 3.2 on, and we accept 3.1).
_ROWS_STATUS = frozenset(
    {pq.ExecStatus.TUPLES_OK, pq.ExecStatus.SINGLE_TUPLE}
    | ({pq.ExecStatus.TUPLES_CHUNK} if hasattr(pq.ExecStatus, "TUPLES_CHUNK") else set())
)


def returned_rows(cursor: psycopg.AsyncCursor[Any] | psycopg.Cursor[Any]) -> bool:
    """Whether the cursor's last statement returned rows (a query, or RETURNING), as
    `cursor.description is not None` says, without building that description: a
    Column object per column, tens of microseconds of the client's CPU on a task's
    row, for every statement the worker runs."""
    result = cursor.pgresult
    return result is not None and (result.nfields > 0 or result.status in _ROWS_STATUS)


async def run(
    conn: AsyncConn, stmt: Statement, params: Mapping[str, Any], clock: Clock | None = None
) -> list[Row]:
    """Run one statement; its rows, or [] for a statement that returns none."""
    cursor = await conn.execute(stmt.text, bind(stmt, params, clock))
    if not returned_rows(cursor):
        return []
    rows: list[Row] = list(await cursor.fetchall())
    return rows


def shut_socket(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Shut `conn`'s socket both ways, as if the server had closed the connection: what
    waits on it fails at once with psycopg's OperationalError, and the connection is
    done. A call cancelled instead has psycopg ask the server to cancel its query first,
    over a new connection, then wait for it: up to 10 s when the server is out of
    reach. False if there was no socket left to shut."""
    with contextlib.suppress(OSError, psycopg.Error):
        # A duplicate of the descriptor: shutdown acts on the connection itself, and
        # closing the duplicate leaves psycopg's descriptor as it was.
        with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
        return True
    return False


#: How long after a missed deadline whatever a block still waits on that is not the
#: database (its socket already shut) is cancelled (`answer_within`'s `backstop_s`).
BACKSTOP_S = 1.0


@contextlib.asynccontextmanager
async def answer_within(
    conn: psycopg.AsyncConnection[Any], timeout_s: float, *, backstop_s: float | None = None
) -> AsyncIterator[None]:
    """The statements run inside must answer within `timeout_s`, or the connection is
    shut (`shut_socket`) and they fail with TimeoutError. With `backstop_s`, whatever
    the block still waits on that long after (something other than the database) is
    cancelled, with TimeoutError too. One timer until the deadline passes."""
    shut = False
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(None) as backstop:

        def expire() -> None:
            nonlocal shut
            shut = shut_socket(conn)
            if backstop_s is not None:
                backstop.reschedule(loop.time() + backstop_s)

        timer = loop.call_later(timeout_s, expire)
        try:
            yield
        except psycopg.OperationalError as exc:
            if shut:
                raise TimeoutError(f"no answer within {timeout_s:g}s") from exc
            raise
        finally:
            timer.cancel()
