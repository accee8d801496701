"""What the daemon asks of a store without knowing its dialect: leadership among hosts,
the pause between purge batches and the tidy-up after a purge."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing

import psycopg
import pytest

from cairnqd.retention import Retention, RetentionSweeper
from cairnqd.store.base import TaskStore
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore


async def test_one_sqlite_host_always_leads(sqlite_path: str) -> None:
    first, second = SQLiteStore(sqlite_path), SQLiteStore(sqlite_path)
    async with first.leadership.exclusive(7, 1) as held, second.leadership.exclusive(7, 1) as again:
        assert held and again  # one file, one host: nothing to exclude
    lock = first.leadership.leader_lock(7, 2)
    assert lock.key == (7, 2)
    assert await lock.ensure()
    await lock.close()
    assert await lock.ensure()


async def test_postgres_exclusive_admits_one_session(pg_dsn: str) -> None:
    first, second = PostgresStore(pg_dsn, max_size=1), PostgresStore(pg_dsn, max_size=1)
    async with first.leadership.exclusive(7, 1) as held:
        assert held
        async with second.leadership.exclusive(7, 1) as again:
            assert not again  # never waits: just says no
        async with second.leadership.exclusive(7, 3) as other_key:
            assert other_key
    async with second.leadership.exclusive(7, 1) as after:
        assert after  # released when the block ended


async def test_postgres_leader_lock_is_kept_until_closed(pg_dsn: str) -> None:
    first, second = PostgresStore(pg_dsn, max_size=1), PostgresStore(pg_dsn, max_size=1)
    leader, follower = first.leadership.leader_lock(7, 2), second.leadership.leader_lock(7, 2)
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


def _vacuums(pg_dsn: str) -> int:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            "select vacuum_count from pg_stat_user_tables where relname = 'cairnq_tasks'"
        ).fetchone()
    assert row is not None
    return int(row[0])


async def _without_autovacuum(pg_dsn: str) -> None:
    """Install the schema, then turn autovacuum off for cairnq_tasks whatever the server
    says (this machine's shared server has it off everywhere; a stock one has it on)."""
    async with PostgresStore(pg_dsn):
        pass
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("alter table cairnq_tasks set (autovacuum_enabled = false)")


async def _canceled_tasks(pg_dsn: str, count: int, *, purge: bool) -> None:
    """`count` tasks submitted and canceled (a dead row version each), then purged when
    `purge` (a second each). The store is closed after, so its backends exit and report
    their counts to the statistics."""
    async with PostgresStore(pg_dsn) as store:
        tasks = await store.submit_many([{"name": "purge.me"} for _ in range(count)])
        for task in tasks:
            await store.cancel(task.id)
        if purge:
            await asyncio.sleep(0.005)  # purge() takes tasks finished strictly before now
            assert len(await store.purge(limit=count)) == count


async def _dead_rows(pg_dsn: str, count: int) -> None:
    await _canceled_tasks(pg_dsn, count, purge=True)


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"{what} within 30 s"
        await asyncio.sleep(0.05)


async def test_postgres_after_purge_vacuums_when_autovacuum_is_off(pg_dsn: str) -> None:
    await _without_autovacuum(pg_dsn)
    await _dead_rows(pg_dsn, 300)
    assert _vacuums(pg_dsn) == 0
    async with PostgresStore(pg_dsn) as store:
        await store.after_purge(wait=True)
        assert _vacuums(pg_dsn) == 1
        await store.after_purge(wait=True)  # nothing dead is left: no second vacuum
        assert _vacuums(pg_dsn) == 1


async def test_postgres_after_purge_vacuums_in_the_background(pg_dsn: str) -> None:
    # The daemon's call: it returns at once and the VACUUM runs on its own connection.
    await _without_autovacuum(pg_dsn)
    await _dead_rows(pg_dsn, 300)
    async with PostgresStore(pg_dsn) as store:
        await store.after_purge()
        await store.after_purge()  # one at a time: this one finds it running, or done
        await _until(lambda: _vacuums(pg_dsn) > 0, "no VACUUM")
    assert _vacuums(pg_dsn) == 1


async def test_sdk_retention_vacuums_when_autovacuum_is_off(pg_dsn: str) -> None:
    # The SDK's own sweeper (CairnQ(retention=...)) tidies up as the daemon's does.
    await _without_autovacuum(pg_dsn)
    await _canceled_tasks(pg_dsn, 300, purge=False)
    async with PostgresStore(pg_dsn) as store:
        await asyncio.sleep(0.005)  # purge takes tasks finished strictly before now
        sweeper = RetentionSweeper(store, Retention(0, limit=100))
        assert await sweeper.sweep() == 300
        await _until(lambda: _vacuums(pg_dsn) > 0, "no VACUUM")


@pytest.mark.timing
async def test_postgres_close_stops_a_vacuum_in_progress(pg_dsn: str) -> None:
    await _without_autovacuum(pg_dsn)
    await _dead_rows(pg_dsn, 300)
    store = PostgresStore(pg_dsn)
    await store.connect()
    # Hold a lock VACUUM must wait for, so it is still running when the store closes.
    with psycopg.connect(pg_dsn) as blocker:
        blocker.execute("lock table cairnq_task_keys in access exclusive mode")
        await store.after_purge()
        await _until(lambda: _vacuum_waiting(pg_dsn), "the VACUUM did not start")
        began = time.monotonic()
        await store.close()
        assert time.monotonic() - began < 20
        assert not _vacuum_waiting(pg_dsn)
        blocker.rollback()


def _vacuum_waiting(pg_dsn: str) -> bool:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            "select count(*) from pg_stat_activity where datname = current_database() "
            "and query like 'vacuum (analyze)%' and state = 'active'"
        ).fetchone()
    return bool(row and row[0])


async def test_postgres_after_purge_leaves_a_few_dead_rows_alone(pg_dsn: str) -> None:
    await _without_autovacuum(pg_dsn)
    await _dead_rows(pg_dsn, 5)  # 10 dead versions: below autovacuum's threshold of 50
    async with PostgresStore(pg_dsn) as store:
        await store.after_purge(wait=True)
    assert _vacuums(pg_dsn) == 0
