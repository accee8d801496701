"""What a psycopg error means (the `DriverErrors` of store/errors.py)."""

from __future__ import annotations

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


__all__ = ["PostgresErrors"]
