"""The Postgres dialect: `PostgresStore` through psycopg 3 (async).

store.py runs the statements on a pool, connect.py opens and configures connections,
listen.py carries LISTEN/NOTIFY wake-ups, leadership.py and lease.py hold leadership
among hosts (session advisory locks, or lease rows behind a transaction pooler),
bulk.py streams a long `submit_many` over COPY.
"""

from cairnqd.store.errors import register
from cairnqd.store.postgres.errors import PostgresErrors
from cairnqd.store.postgres.store import PostgresStore

register(PostgresErrors())

__all__ = ["PostgresStore"]
