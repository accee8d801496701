"""What a database error means for the caller: the one place that reads driver errors.

Everything above `store/` asks `classify(exc)` (the `kind` label of
`cairnq_db_errors_total`) or `is_transient(exc)` (worth retrying as it is) instead of
matching on sqlite3 or psycopg types itself, so a new driver error is taught here once.

- **busy**: another writer or transaction holds what we need (SQLITE_BUSY and
  SQLITE_LOCKED; a Postgres serialization failure or deadlock, which the server rolled
  back). Retrying the same call is the fix.
- **timeout**: a deadline ran out, ours (`asyncio.timeout`, the pool's wait) or the
  server's (`statement_timeout`, `lock_timeout`). The work may still be possible.
- **connect**: the database could not be reached or the connection died.
- **full**: the database has no room to write (SQLite's SQLITE_FULL: its disk is full;
  Postgres's disk_full). The request is fine and succeeds once space is freed, so it is
  retried like the kinds above, but the database answered: not an outage.
- **other**: anything else: a bug, a constraint, bad input. Retrying repeats it.

psycopg is never imported here: a psycopg error can only exist once psycopg has been
imported by the Postgres store, so its classes are looked up in `sys.modules` and a
SQLite-only process never pays for loading the driver (see `store.factory`).
"""

from __future__ import annotations

import sqlite3
import sys
from types import ModuleType
from typing import Literal

from cairnqd.errors import DatabaseUnavailable

ErrorKind = Literal["busy", "timeout", "connect", "full", "other"]

# Primary SQLite result codes (the low byte of an extended code).
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_IOERR = 10
_SQLITE_FULL = 13
_SQLITE_CANTOPEN = 14


def loaded_driver(name: str) -> ModuleType | None:
    """The driver module `name` if this process has imported it, else None: an error
    of a driver never imported cannot be in hand, and importing it to ask would load
    psycopg into every SQLite process."""
    return sys.modules.get(name)


def classify(exc: BaseException) -> ErrorKind:
    """The kind of a database error; see the module docstring."""
    if isinstance(exc, sqlite3.Error):
        return _classify_sqlite(exc)
    if isinstance(exc, TimeoutError):
        return "timeout"
    psycopg, pool = loaded_driver("psycopg"), loaded_driver("psycopg_pool")
    # QueryCanceled and PoolTimeout are OperationalErrors too: test them first.
    if pool is not None and isinstance(exc, pool.PoolTimeout):
        return "timeout"
    if psycopg is not None:
        errors = psycopg.errors
        if isinstance(exc, errors.QueryCanceled | errors.LockNotAvailable):
            return "timeout"
        if isinstance(exc, errors.SerializationFailure | errors.DeadlockDetected):
            return "busy"
        if isinstance(exc, errors.DiskFull):  # an OperationalError too: test it first
            return "full"
        if isinstance(exc, psycopg.OperationalError):
            return "connect"
    if pool is not None and isinstance(exc, pool.PoolClosed):
        return "connect"
    if isinstance(exc, DatabaseUnavailable | OSError):
        return "connect"
    return "other"


def is_transient(exc: BaseException) -> bool:
    """Whether the same call may succeed if simply tried again: the database was busy,
    unreachable or slow, and the request itself was fine."""
    return classify(exc) != "other"


def _classify_sqlite(exc: sqlite3.Error) -> ErrorKind:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        # Raised without a result code (by the module itself, or by a test double):
        # fall back on SQLite's own wording.
        text = str(exc).lower()
        return (
            "busy"
            if isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)
            else "other"
        )
    primary = code & 0xFF
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return "busy"
    if primary in (_SQLITE_IOERR, _SQLITE_CANTOPEN):
        return "connect"
    if primary == _SQLITE_FULL:
        return "full"
    return "other"


def is_sqlite_busy(exc: BaseException) -> bool:
    """SQLITE_BUSY and its extended codes (BUSY_SNAPSHOT, BUSY_RECOVERY) only: the one
    contention the SQLite store retries itself. SQLITE_LOCKED is a conflict on our own
    connection that waiting cannot resolve."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.OperationalError) and code is not None and code & 0xFF == 5


__all__ = ["ErrorKind", "classify", "is_sqlite_busy", "is_transient"]


def is_operational(exc: BaseException) -> bool:
    """An error about the database's operation rather than the statement: it could
    not be opened, reached, locked or written (what an operator must look at)."""
    if isinstance(exc, sqlite3.OperationalError):
        return True
    psycopg = loaded_driver("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.OperationalError)
