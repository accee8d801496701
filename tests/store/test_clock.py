"""An injected store clock: every statement's now on SQLite, the retention cut-off on
Postgres (whose other statements keep the server clock all hosts share)."""

from __future__ import annotations

from cairnqd.store.base import TaskStore, wall_clock_ms
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore
from tests.support.databases import make_store
from tests.support.store import ShiftedClock


def clocked_store(dialect: str, target: str, clock: ShiftedClock) -> TaskStore:
    if dialect == "sqlite":
        return SQLiteStore(target, clock=clock)
    return PostgresStore(target, max_size=2, clock=clock)


async def test_default_clock_is_the_wall_clock(sqlite_path: str) -> None:
    store = SQLiteStore(sqlite_path)
    assert store.clock is None
    assert abs(store.now_ms() - wall_clock_ms()) < 1000


async def test_sqlite_statements_read_the_injected_clock(sqlite_path: str) -> None:
    clock = ShiftedClock(offset_ms=-86_400_000)  # a day ago
    async with SQLiteStore(sqlite_path, clock=clock) as store:
        later = await store.submit(name="clocked", queue="later", delay_ms=5)
        before = clock()
        assert before - 1000 < later.created_at_ms <= before
        assert later.run_at_ms == later.created_at_ms + 5
        await store.submit(name="clocked")
        (claimed,) = await store.claim(queues=["default"], worker_id="w", lease_ms=60_000)
        assert claimed.lease_until_ms is not None
        assert claimed.lease_until_ms - clock() <= 60_000


async def test_a_clock_ahead_ages_rows_for_purge(dialect: str, db_target: str) -> None:
    writer = make_store(dialect, db_target)
    clock = ShiftedClock()
    purger = clocked_store(dialect, db_target, clock)
    async with writer, purger:
        task = await writer.submit(name="aged")
        await writer.cancel(task.id)
        # Just finished: younger than a minute on the real clock.
        assert await purger.count_purgeable(older_than_ms=60_000) == 0
        assert await purger.purge(older_than_ms=60_000) == []
        clock.offset_ms = 61_000
        assert await purger.count_purgeable(older_than_ms=60_000) == 1
        assert await purger.purge(older_than_ms=60_000) == [task.id]


async def test_postgres_keeps_the_server_clock_for_everything_else(pg_dsn: str) -> None:
    clock = ShiftedClock(offset_ms=-86_400_000)
    async with PostgresStore(pg_dsn, max_size=2, clock=clock) as store:
        task = await store.submit(name="server.clock")
        (claimed,) = await store.claim(queues=["default"], worker_id="w")
    # Stamped by the server (this host's clock, give or take), not a day ago.
    assert abs(task.created_at_ms - wall_clock_ms()) < 60_000
    assert claimed.id == task.id
