"""What a database error means for the caller: the one place that reads driver errors.

Everything above `store/` asks `classify(exc)` (the `kind` label of
`cairnq_db_errors_total`) or `is_transient(exc)` (worth retrying as it is) instead of
matching on sqlite3 or psycopg types itself. Each dialect teaches its driver's errors
once, in its package's errors.py, registered when the package is imported.

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

No driver is imported here: a driver's error can only exist once its dialect has been
imported (and registered its reader), so a SQLite-only process never loads psycopg.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Literal, Protocol

from cairnqd.errors import DatabaseUnavailable

ErrorKind = Literal["busy", "timeout", "connect", "full", "other"]


class DriverErrors(Protocol):
    """How one dialect reads its driver's errors."""

    def classify(self, exc: BaseException) -> ErrorKind | None:
        """The kind of `exc`, or None when it is not this driver's error."""
        ...

    def is_operational(self, exc: BaseException) -> bool:
        """Whether `exc` is this driver saying the database could not be opened,
        reached, locked or written."""
        ...


_readers: list[DriverErrors] = []


def register(reader: DriverErrors) -> None:
    """Teach `classify` a driver's errors (each dialect package, once, at import)."""
    if reader not in _readers:
        _readers.append(reader)


def loaded_driver(name: str) -> ModuleType | None:
    """The driver module `name` if this process has imported it, else None: an error
    of a driver never imported cannot be in hand, and importing it to ask would load
    psycopg into every SQLite process."""
    return sys.modules.get(name)


def classify(exc: BaseException) -> ErrorKind:
    """The kind of a database error; see the module docstring."""
    for reader in _readers:
        kind = reader.classify(exc)
        if kind is not None:
            return kind
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, DatabaseUnavailable | OSError):
        return "connect"
    return "other"


def is_transient(exc: BaseException) -> bool:
    """Whether the same call may succeed if simply tried again: the database was busy,
    unreachable or slow, and the request itself was fine."""
    return classify(exc) != "other"


def is_operational(exc: BaseException) -> bool:
    """An error about the database's operation rather than the statement: it could
    not be opened, reached, locked or written (what an operator must look at)."""
    return any(reader.is_operational(exc) for reader in _readers)


__all__ = ["DriverErrors", "ErrorKind", "classify", "is_operational", "is_transient", "register"]
