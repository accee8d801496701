"""What a `sqlite3` error means (the `DriverErrors` of store/errors.py), by SQLite's
primary result code."""

from __future__ import annotations

import sqlite3

from cairnqd.store.errors import ErrorKind

# Primary SQLite result codes (the low byte of an extended code).
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_IOERR = 10
_SQLITE_FULL = 13
_SQLITE_CANTOPEN = 14


class SQLiteErrors:
    def classify(self, exc: BaseException) -> ErrorKind | None:
        if not isinstance(exc, sqlite3.Error):
            return None
        code = getattr(exc, "sqlite_errorcode", None)
        if code is None:
            # Raised without a result code (by the module itself, or by a test double):
            # fall back on SQLite's own wording.
            text = str(exc).lower()
            busy = isinstance(exc, sqlite3.OperationalError) and (
                "locked" in text or "busy" in text
            )
            return "busy" if busy else "other"
        primary = code & 0xFF
        if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
            return "busy"
        if primary in (_SQLITE_IOERR, _SQLITE_CANTOPEN):
            return "connect"
        if primary == _SQLITE_FULL:
            return "full"
        return "other"

    def refused_login(self, exc: BaseException) -> str | None:
        del exc
        return None  # a file has no login to refuse: its errors are other kinds

    def is_operational(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.OperationalError)


def is_sqlite_busy(exc: BaseException) -> bool:
    """SQLITE_BUSY and its extended codes (BUSY_SNAPSHOT, BUSY_RECOVERY) only: the one
    contention the SQLite store retries itself. SQLITE_LOCKED is a conflict on our own
    connection that waiting cannot resolve."""
    code = getattr(exc, "sqlite_errorcode", None)
    return (
        isinstance(exc, sqlite3.OperationalError)
        and code is not None
        and code & 0xFF == _SQLITE_BUSY
    )


__all__ = ["SQLiteErrors", "is_sqlite_busy"]
