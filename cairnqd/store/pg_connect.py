"""Postgres plumbing shared by the store, its listeners and the leadership sessions:
what a connection is opened with, and how one protocol statement runs on it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from cairnqd._protocol import Statement
from cairnqd.store.base import Clock, Row

AsyncConn = psycopg.AsyncConnection[dict[str, Any]]


def session_conninfo(dsn: str, *, statement_timeout_ms: int | None = None) -> str:
    """The conninfo every connection of a store is opened with: the operator's DSN
    plus the store's session settings."""
    if statement_timeout_ms is None:
        return dsn
    # Appended to any `options` the operator set, so theirs still apply.
    options = psycopg.conninfo.conninfo_to_dict(dsn).get("options") or ""
    timeout = f"{options} -c statement_timeout={int(statement_timeout_ms)}".strip()
    return psycopg.conninfo.make_conninfo(dsn, options=timeout)


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
