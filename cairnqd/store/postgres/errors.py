"""What a psycopg error means (the `DriverErrors` of store/errors.py)."""

from __future__ import annotations

import re

import psycopg
import psycopg_pool

from cairnqd.store.errors import ErrorKind


class PostgresErrors:
    def classify(self, exc: BaseException) -> ErrorKind | None:
        errors = psycopg.errors
        # QueryCanceled, DiskFull and PoolTimeout are OperationalErrors too: test them
        # before OperationalError.
        if isinstance(exc, psycopg_pool.PoolTimeout):
            return "timeout"
        if isinstance(exc, errors.QueryCanceled | errors.LockNotAvailable):
            return "timeout"
        if isinstance(exc, errors.SerializationFailure | errors.DeadlockDetected):
            return "busy"
        if isinstance(exc, errors.DiskFull):
            return "full"
        if isinstance(exc, psycopg.OperationalError | psycopg_pool.PoolClosed):
            return "connect"
        return None

    def is_operational(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.OperationalError)

    def refused_login(self, exc: BaseException) -> str | None:
        """A refused connection carries no SQLSTATE in psycopg, only the server's FATAL
        line; these are the ones no retry changes (in the server's default English:
        a server with another `lc_messages` is read as unreachable, and waited for)."""
        if not isinstance(exc, psycopg.OperationalError):
            return None
        text = str(exc)
        if "FATAL:" not in text:
            return None
        fatal = text.split("FATAL:", 1)[1].strip().splitlines()[0].strip()
        return fatal if any(p.search(fatal) for p in _REFUSALS) else None


#: The server's FATAL lines of a login that will never succeed as configured.
_REFUSALS = (
    re.compile(r'^database ".*" does not exist'),
    re.compile(r'^role ".*" does not exist'),
    re.compile(r"^password authentication failed"),
    re.compile(r"^no pg_hba\.conf entry"),
    re.compile(r'^role ".*" is not permitted to log in'),
    re.compile(r"^permission denied for database"),
)


__all__ = ["PostgresErrors"]
