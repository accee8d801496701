"""The Postgres migration runner. Each migration runs once, recorded in its ledger, and
none stalls the workers for longer than a bound (docs/architecture.md, "Migrations"):

- an ordinary migration runs in one transaction that holds an exclusive lock on the
  ledger table, checks the ledger and, if the name is absent, runs the file and records
  it. Every lock it takes waits at most `LOCK_TIMEOUT_MS`: a statement waiting for a
  lock holds up every later claim on that table, so a migration that cannot have its
  locks soon gives them up and tries again, rather than queueing the workers behind it;
- a migration that builds an index `concurrently` cannot run in a transaction. It runs
  statement by statement under a session advisory lock (so two processes do not build
  together), first dropping an invalid index an interrupted build left behind, and is
  recorded once every statement has run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql

from cairnqd._protocol import Migration, migrations, strip_comments, to_psycopg
from cairnqd.errors import CairnQError
from cairnqd.store.migrate import LEDGER_TABLES, ledger_sql, pending

log = logging.getLogger("cairnqd.migrate")

AsyncConn = psycopg.AsyncConnection[Any]

#: The longest a migration's statement waits for a lock before it gives up and retries:
#: the bound on how long claims and submits can wait behind a migration.
LOCK_TIMEOUT_MS = 2_000
#: Attempts per migration (with a growing pause between them) before `migrate` fails.
LOCK_ATTEMPTS = 20
_FIRST_PAUSE_S = 0.5
_MAX_PAUSE_S = 10.0
#: The session advisory lock online migrations run under: the daemon's namespace
#: (database.lock_namespace's default) and an id of their own.
_MIGRATION_LOCK = (0x63716E64, 9)

#: How often a process waiting for another's online migration tries the lock again.
_LOCK_POLL_S = 0.1

_CONCURRENTLY = re.compile(r"\bconcurrently\b", re.I)
_INDEX_NAME = re.compile(r"\bindex\s+concurrently\s+if\s+not\s+exists\s+(\w+)", re.I)


class MigrationBlocked(CairnQError):
    """A migration could not have its locks within the bound, attempt after attempt."""


def is_online(migration: Migration) -> bool:
    """Whether `migration` builds indexes concurrently (and so runs outside a
    transaction)."""
    return bool(_CONCURRENTLY.search(strip_comments(migration.sql)))


def statements_of(text: str) -> list[str]:
    """An online migration's statements, one by one (each ends with `;`)."""
    return [" ".join(s.split()) for s in strip_comments(text).split(";") if s.strip()]


async def pending_postgres(conn: AsyncConn) -> list[str]:
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


async def apply_postgres(conn: AsyncConn, *, session_locks: bool = True) -> list[str]:
    """Apply missing migrations on an autocommit connection; the names applied.

    Without `session_locks` (a transaction pooler, no direct DSN) an online migration
    cannot be serialized by an advisory lock, and two processes building one index
    concurrently deadlock: it then runs plainly, in its locked transaction."""
    applied: list[str] = []
    for ledger in ("cairnq", "cairnqd"):
        await conn.execute(ledger_sql("postgres", ledger, "ledger_create"))
    # Read first, lock only for what is missing: a database already migrated is never
    # locked by a process that merely starts (the ledger is checked again under the lock).
    missing = set(await pending_postgres(conn))
    for migration in migrations("postgres"):
        if migration.name not in missing:
            continue
        if is_online(migration) and not session_locks:
            # Expected behind such a pooler (docs/architecture.md, "Migrations"): said,
            # not warned about.
            log.info(
                "migration %s builds its index without `concurrently`: behind a "
                "transaction pooler without database.direct_dsn, only a transaction "
                "can keep two processes from building it at once",
                migration.name,
            )
            migration = dataclasses.replace(migration, sql=_CONCURRENTLY.sub("", migration.sql))
        apply = _apply_online if is_online(migration) else _apply_in_transaction
        if await _patiently(migration, functools.partial(apply, conn, migration)):
            applied.append(migration.name)
    return applied


async def _patiently(migration: Migration, attempt: Callable[[], Awaitable[bool]]) -> bool:
    """Run `attempt`, again after a pause each time it gave up waiting for a lock."""
    pause = _FIRST_PAUSE_S
    for tries in range(1, LOCK_ATTEMPTS + 1):
        try:
            return await attempt()
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
            if tries == LOCK_ATTEMPTS:
                break
            # Once is contention (processes that start together migrate together; a
            # concurrent index build waits for every transaction under way): said. Again,
            # something holds the table: warned about.
            log.log(
                logging.INFO if tries == 1 else logging.WARNING,
                "migration %s: a lock was not free within %d ms (a long transaction holds "
                "the table, or it deadlocked with another); trying again in %.1f s",
                migration.name,
                LOCK_TIMEOUT_MS,
                pause,
            )
            await asyncio.sleep(pause)
            pause = min(pause * 2, _MAX_PAUSE_S)
    raise MigrationBlocked(
        f"migration {migration.name}: its locks were not free within {LOCK_TIMEOUT_MS} ms "
        f"on {LOCK_ATTEMPTS} attempts; a long-running transaction holds a table it changes "
        "(pg_stat_activity names it). Nothing of this migration was applied"
    )


async def _apply_in_transaction(conn: AsyncConn, migration: Migration) -> bool:
    async with conn.transaction():
        await conn.execute(f"set local lock_timeout = {LOCK_TIMEOUT_MS}")
        await conn.execute(ledger_sql("postgres", migration.ledger, "ledger_lock"))
        if await _is_applied(conn, migration):
            return False
        # Without parameters psycopg uses the simple query protocol, so a file may hold
        # many statements (and `%` needs no escaping).
        await conn.execute(migration.sql)
        await _record(conn, migration)
        return True


async def _apply_online(conn: AsyncConn, migration: Migration) -> bool:
    await _take_migration_lock(conn)
    try:
        if await _is_applied(conn, migration):
            return False
        # The role's statement timeout would end a long build; the lock timeout still
        # bounds every wait for a lock.
        await conn.execute("set statement_timeout = 0")
        await conn.execute(f"set lock_timeout = {LOCK_TIMEOUT_MS}")
        for text in statements_of(migration.sql):
            await drop_invalid_index(conn, text)
            await conn.execute(text)
        async with conn.transaction():
            await conn.execute(f"set local lock_timeout = {LOCK_TIMEOUT_MS}")
            await conn.execute(ledger_sql("postgres", migration.ledger, "ledger_lock"))
            if await _is_applied(conn, migration):
                return False
            await _record(conn, migration)
        log.info("migration %s applied online (indexes built concurrently)", migration.name)
        return True
    finally:
        await conn.execute("reset statement_timeout")
        await conn.execute("reset lock_timeout")
        await conn.execute("select pg_advisory_unlock(%s::integer, %s::integer)", _MIGRATION_LOCK)


async def _take_migration_lock(conn: AsyncConn) -> None:
    """Wait for another process's online migration (it builds the same index) by trying
    again and again, never inside a statement that waits: a concurrent build waits for
    every transaction under way to end, and a waiting `pg_advisory_lock` is one, so the
    two would deadlock."""
    while True:
        cur = await conn.execute(
            "select pg_try_advisory_lock(%s::integer, %s::integer)", _MIGRATION_LOCK
        )
        row = await cur.fetchone()
        locked = row is not None and bool(
            next(iter(row.values())) if isinstance(row, dict) else row[0]
        )
        if locked:
            return
        await asyncio.sleep(_LOCK_POLL_S)


async def _is_applied(conn: AsyncConn, migration: Migration) -> bool:
    cur = await conn.execute(
        to_psycopg(ledger_sql("postgres", migration.ledger, "ledger_applied")),
        {"name": migration.name},
    )
    return await cur.fetchone() is not None


async def _record(conn: AsyncConn, migration: Migration) -> None:
    await conn.execute(
        to_psycopg(ledger_sql("postgres", migration.ledger, "ledger_record")),
        {"name": migration.name},
    )


async def drop_invalid_index(conn: AsyncConn, statement: str) -> None:
    """Before `create index concurrently if not exists NAME`: drop NAME if an earlier
    build was interrupted and left it invalid, which `if not exists` would keep."""
    match = _INDEX_NAME.search(statement)
    if match is None:
        return
    index = match.group(1)
    cur = await conn.execute(
        "select 1 from pg_index i join pg_class c on c.oid = i.indexrelid "
        "where c.relname = %s and not i.indisvalid and pg_table_is_visible(c.oid)",
        (index,),
    )
    if await cur.fetchone() is not None:
        log.warning("dropping the invalid index %s (a build did not finish) to rebuild it", index)
        await conn.execute(
            sql.SQL("drop index concurrently if exists {}").format(sql.Identifier(index))
        )
