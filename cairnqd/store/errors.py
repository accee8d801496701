"""Database errors, classified in one place (placeholder until the store refactor lands)."""

from __future__ import annotations

import sqlite3

import psycopg

from cairnqd.errors import DatabaseUnavailable


def is_transient(exc: BaseException) -> bool:
    """Errors worth retrying as they are: the database was busy or unreachable."""
    return isinstance(
        exc, sqlite3.OperationalError | psycopg.OperationalError | DatabaseUnavailable | OSError
    )
