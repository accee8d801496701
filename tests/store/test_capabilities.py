"""What the daemon asks of a store without knowing its dialect: leadership among hosts,
the pause between purge batches and the tidy-up after a purge."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing

import psycopg

from cairnqd.store.base import TaskStore
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore


async def test_one_sqlite_host_always_leads(sqlite_path: str) -> None:
    first, second = SQLiteStore(sqlite_path), SQLiteStore(sqlite_path)
    async with first.exclusive(7, 1) as held, second.exclusive(7, 1) as again:
        assert held and again  # one file, one host: nothing to exclude
    lock = first.leader_lock(7, 2)
    assert lock.key == (7, 2)
    assert await lock.ensure()
    await lock.close()
    assert await lock.ensure()


async def test_postgres_exclusive_admits_one_session(pg_dsn: str) -> None:
    first, second = PostgresStore(pg_dsn, max_size=1), PostgresStore(pg_dsn, max_size=1)
    async with first.exclusive(7, 1) as held:
        assert held
        async with second.exclusive(7, 1) as again:
            assert not again  # never waits: just says no
        async with second.exclusive(7, 3) as other_key:
            assert other_key
    async with second.exclusive(7, 1) as after:
        assert after  # released when the block ended


async def test_postgres_leader_lock_is_kept_until_closed(pg_dsn: str) -> None:
    first, second = PostgresStore(pg_dsn, max_size=1), PostgresStore(pg_dsn, max_size=1)
    leader, follower = first.leader_lock(7, 2), second.leader_lock(7, 2)
    try:
        assert await leader.ensure()
        assert not await follower.ensure()
        assert await leader.ensure()  # sticky: no second hold stacked on the first
        with psycopg.connect(pg_dsn) as conn:
            holds = conn.execute(
                "select count(*) from pg_locks where locktype = 'advisory' and granted "
                "and database = (select oid from pg_database where datname = current_database())"
            ).fetchone()
        assert holds == (1,)
        await leader.close()
        assert await follower.ensure()
    finally:
        await leader.close()
        await follower.close()


def test_purge_batch_pause_per_dialect(sqlite_path: str) -> None:
    assert SQLiteStore(sqlite_path).purge_batch_pause_s > 0
    assert PostgresStore("host=db.example").purge_batch_pause_s == 0


async def test_after_purge_runs_on_both_dialects(store: TaskStore) -> None:
    task = await store.submit(name="purge.me")
    await store.cancel(task.id)
    # purge() takes tasks finished strictly before now: let the millisecond turn over.
    await asyncio.sleep(0.005)
    assert await store.purge() == [task.id]
    await store.after_purge()
    assert await store.get(task.id) is None


def _in_main_file(path: str) -> int:
    """Tasks in the database file itself, ignoring whatever the WAL holds."""
    with closing(sqlite3.connect(f"file:{path}?immutable=1", uri=True)) as conn:
        return int(conn.execute("select count(*) from cairnq_tasks").fetchone()[0])


async def test_sqlite_after_purge_checkpoints_the_wal(sqlite_path: str) -> None:
    async with SQLiteStore(sqlite_path) as store:
        task = await store.submit(name="purge.me")
        await store.cancel(task.id)
        await store.after_purge()
        assert _in_main_file(sqlite_path) == 1
        assert await store.purge() == [task.id]
        assert _in_main_file(sqlite_path) == 1  # the delete is still only in the WAL
        await store.after_purge()
        assert _in_main_file(sqlite_path) == 0
