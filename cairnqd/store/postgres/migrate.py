"""The Postgres migration runner: one transaction per migration holding an exclusive
lock on the ledger table, in which the ledger is checked and, if the name is absent,
the file runs and is recorded."""

from __future__ import annotations

from typing import Any

import psycopg

from cairnqd._protocol import migrations, to_psycopg
from cairnqd.store.migrate import LEDGER_TABLES, ledger_sql, pending


async def pending_postgres(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    applied: dict[str, set[str]] = {}
    for ledger, table in LEDGER_TABLES.items():
        cur = await conn.execute(
            to_psycopg(ledger_sql("postgres", "cairnq", "ledger_exists")), {"table_name": table}
        )
        row = await cur.fetchone()
        present = bool(row and (row["n"] if isinstance(row, dict) else row[0]))
        names: set[str] = set()
        if present:
            cur = await conn.execute(ledger_sql("postgres", ledger, "ledger_names"))
            names = {r["name"] if isinstance(r, dict) else r[0] for r in await cur.fetchall()}
        applied[ledger] = names
    return pending(applied, "postgres")


async def apply_postgres(conn: psycopg.AsyncConnection[object]) -> list[str]:
    """Apply missing migrations on Postgres, one locked transaction each."""
    applied: list[str] = []
    for ledger in ("cairnq", "cairnqd"):
        await conn.execute(ledger_sql("postgres", ledger, "ledger_create"))
    for migration in migrations("postgres"):
        async with conn.transaction():
            await conn.execute(ledger_sql("postgres", migration.ledger, "ledger_lock"))
            cur = await conn.execute(
                to_psycopg(ledger_sql("postgres", migration.ledger, "ledger_applied")),
                {"name": migration.name},
            )
            if await cur.fetchone() is not None:
                continue
            # Without parameters psycopg uses the simple query protocol, so a file
            # may hold many statements (and `%` needs no escaping).
            await conn.execute(migration.sql)
            await conn.execute(
                to_psycopg(ledger_sql("postgres", migration.ledger, "ledger_record")),
                {"name": migration.name},
            )
            applied.append(migration.name)
    return applied
