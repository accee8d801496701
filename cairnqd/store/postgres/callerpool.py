"""A connection pool the caller owns: `CairnQ.postgres(pool)` with a psycopg_pool
`AsyncConnectionPool` the application already runs (docs/transactions.md, "Sharing
your connection pool").

The store borrows the pool's connections for its statements and never opens, resizes
or closes the pool. The application's connections are configured for the
application, not for us: a borrowed connection is put in autocommit, with dict rows
and the store's JSON decoding, for as long as the store holds it, and handed back as
it came. Connections of the store's own (migrations, LISTEN, the daemon's sessions)
are opened from the pool's connection parameters, never taken from the pool for
good.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.pq import Format
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from cairnqd._jsoncodec import load_json_or_marker
from cairnqd.store.postgres.connect import AsyncConn

CallerPool = AsyncConnectionPool[Any]

#: Connection options a pool's `kwargs` may hold that are not libpq parameters.
_OPTIONS = ("autocommit", "row_factory", "cursor_factory", "context", "prepare_threshold")
_JSON_TYPES = ("json", "jsonb")


def caller_pool(source: object) -> CallerPool | None:
    """`source` as a caller's pool; None for a DSN; a clear error for anything else."""
    if isinstance(source, str):
        return None
    if isinstance(source, AsyncConnectionPool):
        return source
    kind = f"{type(source).__module__}.{type(source).__qualname__}"
    if isinstance(source, ConnectionPool):
        hint = "a sync pool cannot serve an asyncio store: open a psycopg_pool.AsyncConnectionPool"
    elif isinstance(source, psycopg.AsyncConnection | psycopg.Connection):
        hint = (
            "one connection cannot carry the store's concurrent transactions: pass the pool "
            "it came from, or use it as tx= for a submit inside your transaction"
        )
    elif all(callable(getattr(source, name, None)) for name in ("query", "transaction")):
        hint = (
            "cairnqd runs on psycopg 3 and takes no executor over another driver (such as "
            "cairnq's asyncpg create_pool_executor): pass the DSN it was built from"
        )
    else:
        hint = "pass a libpq DSN or a psycopg_pool.AsyncConnectionPool"
    raise TypeError(
        f"source must be a DSN or a psycopg_pool.AsyncConnectionPool; got a {kind}: {hint}"
    )


async def pool_dsn(pool: CallerPool) -> tuple[str, dict[str, Any]]:
    """The libpq parameters `pool` connects with, as one conninfo, and the connection
    options of its own connections worth keeping (`prepare_threshold`, for a pool
    behind PgBouncer). Read when the store connects: a pool may compute them per
    connection (a callable, for rotating credentials)."""
    conninfo = await pool._resolve_conninfo()
    kwargs = dict(await pool._resolve_kwargs())
    options = {k: kwargs.pop(k) for k in _OPTIONS if k in kwargs}
    keep = {k: v for k, v in options.items() if k == "prepare_threshold"}
    return psycopg.conninfo.make_conninfo(conninfo, **kwargs), keep


def check_open(pool: CallerPool) -> None:
    if pool.closed:
        raise RuntimeError(
            f"the connection pool {pool.name!r} given as source is closed (or was never "
            "opened): the store uses your pool but never opens or closes it; await "
            "pool.open() first"
        )


@asynccontextmanager
async def lent(pool: CallerPool) -> AsyncIterator[AsyncConn]:
    """A connection of `pool` set up as the store's own are, restored when it goes back.

    A connection whose settings cannot be restored (the store's operation was cut
    off mid-statement) is closed instead, so the pool replaces it rather than lend
    the application a connection in a state it did not ask for."""
    async with pool.connection() as conn:
        autocommit, rows = conn.autocommit, conn.row_factory
        adapters = conn.adapters
        # Each loader class knows its format: registering it back restores that slot.
        loaders = [
            (info.oid, adapters.get_loader(info.oid, fmt))
            for name in _JSON_TYPES
            if (info := adapters.types.get(name)) is not None
            for fmt in (Format.TEXT, Format.BINARY)
        ]
        if not autocommit:
            await conn.set_autocommit(True)
        conn.row_factory = dict_row
        set_json_loads(load_json_or_marker, conn)
        try:
            yield conn
        finally:
            conn.row_factory = rows
            for oid, loader in loaders:
                if loader is not None:
                    adapters.register_loader(oid, loader)
            if not autocommit and not conn.closed:
                try:
                    await conn.set_autocommit(False)
                except psycopg.Error:
                    with contextlib.suppress(psycopg.Error):
                        await conn.close()
