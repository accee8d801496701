"""The stores of the parent's database threads (maintenance, scheduler, metrics), and how
their errors are labelled.

Each thread opens its own: a single connection, never shared with another thread or
handed across a fork. Every call is bounded (`DAEMON_CALL_TIMEOUT_S`), so a silent
server shows as an outage in time rather than a thread that hangs.
"""

from __future__ import annotations

import dataclasses

from cairnqd.config import DatabaseConfig
from cairnqd.store.base import TaskStore
from cairnqd.store.errors import classify
from cairnqd.store.factory import store_for
from cairnqd.store.reachability import DAEMON_CALL_TIMEOUT_S
from cairnqd.store.sqlite.files import known_file_uri

__all__ = ["db_error_kind", "parent_store"]


def db_error_kind(exc: BaseException) -> str:
    """Classify a database error into the `kind` label: busy, timeout, connect, full, other."""
    return classify(exc)


def parent_store(
    database: DatabaseConfig,
    *,
    statement_timeout_ms: int | None = None,
    call_timeout_s: float = DAEMON_CALL_TIMEOUT_S,
) -> TaskStore:
    """A store for one of the parent's threads: a single connection, never shared.

    `statement_timeout_ms` bounds each statement server-side on Postgres and the busy
    wait on SQLite (the metrics collector passes its 2 s scrape budget);
    `call_timeout_s`, how long a call waits for an answer before its connection is shut.
    A SQLite file the supervisor created (or found) at start is opened only if it
    still exists.
    """
    if database.path is not None:
        database = dataclasses.replace(database, path=known_file_uri(database.path))
    return store_for(
        database,
        "background",
        statement_timeout_ms=statement_timeout_ms,
        call_timeout_s=call_timeout_s,
    )
