"""Postgres plumbing shared by the store, its listeners and the leadership sessions:
what a connection is opened with, how one protocol statement runs on it, and how a
process tells that its database has stopped answering.

Silent network partitions. A peer that vanishes without a FIN or RST (a cable pulled,
a NAT entry dropped, a host frozen) leaves a TCP connection that looks open forever:
an idle pool connection or a LISTEN connection would wait on it indefinitely. Every
connection therefore asks the kernel to notice: keepalive probes after 10 s idle, every
5 s, and `tcp_user_timeout` of 25 s for data (or probes) left unacknowledged, so a dead
peer is detected within about 25-30 s, idle or busy. Values the DSN sets win. (Unix
sockets ignore all of it, as they cannot partition.)

The kernel cannot see every partition: a middlebox that keeps acknowledging while
forwarding nothing (a proxy whose upstream went silent) keeps keepalives happy. So the
daemon also bounds every call on its own side, `DAEMON_CALL_TIMEOUT_S`: a claim, a lease
renewal, a settlement or a maintenance statement that has not answered by then fails,
and its connection is closed rather than reused. psycopg first tries to cancel the
query server-side, which costs up to another `CANCEL_GRACE_S`. Together:

    **a dead connection is detected within `DETECTION_BOUND_S` (30 s) by default**,

by whichever of the two comes first. `Reachability` turns those failures into one
outage with a start time, which the daemon logs once and reports on /healthz.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import psycopg

from cairnqd._protocol import Statement
from cairnqd.store.base import Clock, Row
from cairnqd.store.errors import classify

AsyncConn = psycopg.AsyncConnection[dict[str, Any]]


#: libpq parameters every connection gets unless its DSN sets them (see above).
KEEPALIVES: dict[str, str] = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "25000",
}

#: How long the daemon's children and background threads let one store call take.
DAEMON_CALL_TIMEOUT_S = 15.0
#: What psycopg may add to a timed-out call: a server-side cancel (5 s to connect),
#: then up to 5 s for the query to end, before it drops the connection itself.
CANCEL_GRACE_S = 10.0
#: The stated bound: a silent connection fails a call within this (see above).
DETECTION_BOUND_S = 30.0
assert DAEMON_CALL_TIMEOUT_S + CANCEL_GRACE_S <= DETECTION_BOUND_S


class Reachability:
    """Whether the database answers this process, from the outcome of its calls.

    A call that failed for want of the database (a timeout, a refused or dropped
    connection) starts an outage; the next call that succeeds ends it. Busy errors and
    bad statements say nothing about the network and are ignored. Written from one
    event loop, read from any thread (plain attribute swaps).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        #: When the current outage began (monotonic), or None while the database answers.
        self.down_since: float | None = None
        #: The error that began the current outage, or the last one before recovery.
        self.error = ""

    def succeeded(self) -> None:
        self.down_since = None

    def failed(self, exc: BaseException, *, since: float | None = None) -> None:
        """Count `exc` against the database if it is a connectivity failure; `since`:
        when the failed call began (the outage is dated from it), else now."""
        if not is_unreachable(exc):
            return
        if self.down_since is None:
            self.error = f"{type(exc).__name__}: {exc}".rstrip(": ")
            self.down_since = self._clock() if since is None else since

    def down_for(self) -> float:
        """Seconds the database has failed to answer; 0 while it does."""
        since = self.down_since
        return 0.0 if since is None else max(0.0, self._clock() - since)


def is_unreachable(exc: BaseException) -> bool:
    """Whether `exc` means the database did not answer (rather than answered no)."""
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return False  # the server answered: its own statement_timeout
    return classify(exc) in ("timeout", "connect")


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


async def run(
    conn: AsyncConn, stmt: Statement, params: Mapping[str, Any], clock: Clock | None = None
) -> list[Row]:
    """Run one statement; its rows, or [] for a statement that returns none."""
    cursor = await conn.execute(stmt.text, bind(stmt, params, clock))
    if cursor.description is None:
        return []
    rows: list[Row] = list(await cursor.fetchall())
    return rows
