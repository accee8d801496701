"""The Postgres dialect: `PostgresStore` through psycopg 3 (async).

store.py runs the statements on a pool, connect.py opens and configures connections,
listen.py carries LISTEN/NOTIFY wake-ups, leadership.py and lease.py hold leadership
among hosts (session advisory locks, or lease rows behind a transaction pooler),
bulk.py streams a long `submit_many` over COPY.
"""

from cairnqd.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
