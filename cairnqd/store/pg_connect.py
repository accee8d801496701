"""Postgres plumbing shared by the store, its listeners and the leadership sessions:
what a connection is opened with, and how one protocol statement runs on it.

Silent network partitions. A peer that vanishes without a FIN or RST (a cable pulled,
a NAT entry dropped, a host frozen) leaves a TCP connection that looks open forever:
an idle pool connection or a LISTEN connection would wait on it indefinitely. Every
connection therefore asks the kernel to notice: keepalive probes after 10 s idle, every
5 s, and `tcp_user_timeout` of 25 s for data (or probes) left unacknowledged, so a dead
peer is detected within about 25-30 s, idle or busy. Values the DSN sets win. (Unix
sockets ignore all of it, as they cannot partition.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from cairnqd._protocol import Statement
from cairnqd.store.base import Clock, Row

AsyncConn = psycopg.AsyncConnection[dict[str, Any]]


#: libpq parameters every connection gets unless its DSN sets them (see above).
KEEPALIVES: dict[str, str] = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "25000",
}


def session_conninfo(dsn: str, *, statement_timeout_ms: int | None = None) -> str:
    """The conninfo every connection of a store is opened with: the operator's DSN,
    the keepalive settings it does not set itself, and the store's session settings."""
    given = psycopg.conninfo.conninfo_to_dict(dsn)
    extra: dict[str, Any] = {k: v for k, v in KEEPALIVES.items() if k not in given}
    if statement_timeout_ms is not None:
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
