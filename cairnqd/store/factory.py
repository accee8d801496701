"""Build a store from a database configuration, shaped for the process that uses it:
a worker child (a pool, maybe LISTEN), a parent's background thread (one connection,
bounded statements) or a CLI command. Postgres is imported only when a DSN asks for it
(docs/architecture.md, "Store purposes").
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

from cairnqd.config.units import to_ms
from cairnqd.store.base import Clock, TaskStore
from cairnqd.store.sqlite import SQLiteStore
from cairnqd.store.sqlite.files import is_memory

if TYPE_CHECKING:
    from cairnqd.config import DatabaseConfig

# How long one Postgres operation may take on our side before it fails instead of
# hanging on a server that stopped answering. The same value as PostgresStore's own
# default (a test keeps them equal), named here so choosing it needs no psycopg.
DEFAULT_CALL_TIMEOUT_S = 60.0

StorePurpose = Literal["worker", "background", "cli"]
PURPOSES: tuple[StorePurpose, ...] = ("worker", "background", "cli")


def store_for(
    database: DatabaseConfig,
    purpose: StorePurpose,
    *,
    statement_timeout_ms: int | None = None,
    migrate: bool | None = None,
    call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S,
    clock: Clock | None = None,
) -> TaskStore:
    """A store on the configured database for `purpose`. `migrate` overrides
    `database.auto_migrate` (`cairnqd migrate` always applies)."""
    return build_store(
        purpose,
        path=database.path,
        dsn=database.dsn,
        busy_timeout_ms=to_ms(database.busy_timeout),
        connect_timeout_s=database.connect_timeout.total_seconds(),
        auto_migrate=database.auto_migrate if migrate is None else migrate,
        connections=database.connections_per_child,
        statement_timeout_ms=statement_timeout_ms,
        call_timeout_s=call_timeout_s,
        clock=clock,
        pooler=database.pooler,
        direct_dsn=database.direct_dsn if purpose != "worker" else None,
    )


def build_store(
    purpose: StorePurpose,
    *,
    path: str | None = None,
    dsn: str | None = None,
    busy_timeout_ms: int = 5000,
    connect_timeout_s: float = 10.0,
    auto_migrate: bool = True,
    connections: int = 1,
    statement_timeout_ms: int | None = None,
    call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S,
    clock: Clock | None = None,
    pooler: str = "none",
    direct_dsn: str | None = None,
    push: str = "listen",
) -> TaskStore:
    """A store on the SQLite file `path` or the Postgres `dsn` (exactly one of them).

    `connections` sizes a worker's pool; the other purposes always use one connection.
    `statement_timeout_ms` bounds each statement (see the module docstring);
    `call_timeout_s` bounds each Postgres operation on our side, so one on a server that
    stopped answering fails instead of hanging (see `PostgresStore._borrow`); `clock` is
    for tests (see `Clock`). `pooler` and `direct_dsn`: see `PostgresStore`. `push`
    (workers): "listen" for a LISTEN of its own where that works, "pipe" when the
    daemon's parent passes wake-ups on instead, "off" to poll only.
    """
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {', '.join(PURPOSES)}; got {purpose!r}")
    if (path is None) == (dsn is None):
        raise ValueError("give exactly one of path (SQLite) and dsn (Postgres)")
    if path is not None:
        if statement_timeout_ms is not None:
            busy_timeout_ms = min(busy_timeout_ms, statement_timeout_ms)
        return SQLiteStore(path, busy_timeout_ms=busy_timeout_ms, migrate=auto_migrate, clock=clock)
    assert dsn is not None
    from cairnqd.store.postgres import PostgresStore  # see the module docstring

    return PostgresStore(
        dsn,
        min_size=1,
        max_size=max(1, connections) if purpose == "worker" else 1,
        connect_timeout_s=connect_timeout_s,
        migrate=auto_migrate,
        listen=purpose == "worker" and push == "listen" and pooler != "transaction",
        statement_timeout_ms=statement_timeout_ms,
        call_timeout_s=call_timeout_s,
        clock=clock,
        pooler=pooler,
        direct_dsn=direct_dsn,
        relayed=purpose == "worker" and push == "pipe",
    )


def missing_sqlite_file(database: DatabaseConfig) -> str | None:
    """The SQLite file `database` names, if it does not exist yet (None for Postgres,
    in-memory and URI names): opening it would create it."""
    path = database.path
    if path is None or is_memory(path) or path.startswith("file:") or os.path.exists(path):
        return None
    return path


__all__ = [
    "DEFAULT_CALL_TIMEOUT_S",
    "PURPOSES",
    "StorePurpose",
    "build_store",
    "missing_sqlite_file",
    "store_for",
]
