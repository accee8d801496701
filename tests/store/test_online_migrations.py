"""Postgres migrations that never hold the workers up for long: an index migration built
`concurrently` (and rebuilt when an interrupted build left it invalid), and a migration
that cannot have its lock giving it up within the bound, so claims go on meanwhile."""

from __future__ import annotations

import asyncio
import functools
import logging
import time

import psycopg
import pytest

from cairnqd.store.postgres import PostgresStore
from cairnqd.store.postgres import migrate as pg_migrate
from tests.support.databases import PgDatabases, require_postgres
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.slow

INDEX = "cairnqd_task_keys_task_id_idx"


@pytest.fixture
def pg_target(pg_databases: PgDatabases) -> str:
    require_postgres()
    return pg_databases.new()


def _sql(target: str, text: str) -> list[tuple[object, ...]]:
    with psycopg.connect(target, autocommit=True) as conn:
        cur = conn.execute(text)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def _index_state(target: str) -> list[tuple[object, ...]]:
    return _sql(
        target,
        "select i.indisvalid, pg_get_indexdef(c.oid) from pg_index i "
        f"join pg_class c on c.oid = i.indexrelid where c.relname = '{INDEX}'",
    )


async def test_an_interrupted_index_build_is_rebuilt_concurrently(
    pg_target: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with PostgresStore(pg_target) as store:
        for key in ("k1", "k2"):
            await store.submit(name="t", key=key)
    [(valid, _)] = _index_state(pg_target)
    assert valid is True
    assert pg_migrate.is_online(
        next(m for m in pg_migrate.migrations("postgres") if m.name.startswith("cairnqd_0001"))
    )
    # Undo the migration, and leave what an interrupted build leaves: an invalid index
    # under its name (a unique build that failed on the two rows).
    _sql(pg_target, f"drop index {INDEX}")
    _sql(pg_target, "delete from cairnqd_migrations where name like 'cairnqd_0001%'")
    with pytest.raises(psycopg.errors.UniqueViolation):
        _sql(pg_target, f"create unique index concurrently {INDEX} on cairnq_task_keys ((1))")
    [(valid, _)] = _index_state(pg_target)
    assert valid is False

    caplog.set_level(logging.INFO, "cairnqd.migrate")
    async with PostgresStore(pg_target):
        pass
    [(valid, definition)] = _index_state(pg_target)
    assert valid is True and "UNIQUE" not in str(definition) and "(task_id)" in str(definition)
    assert any("dropping the invalid index" in r.message for r in caplog.records)
    assert any("applied online" in r.message for r in caplog.records)
    ledger = _sql(pg_target, "select name from cairnqd_migrations where name like 'cairnqd_0001%'")
    assert len(ledger) == 1


async def test_a_migration_that_cannot_have_its_lock_lets_claims_through(
    pg_target: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(pg_migrate, "LOCK_TIMEOUT_MS", 300)
    monkeypatch.setattr(pg_migrate, "_FIRST_PAUSE_S", 0.2)
    monkeypatch.setattr(pg_migrate, "_MAX_PAUSE_S", 0.2)
    caplog.set_level(logging.WARNING, "cairnqd.migrate")
    worker = PostgresStore(pg_target)
    await worker.connect()
    try:
        for i in range(200):
            await worker.submit(name="t", payload={"i": i})
        # Undo cairnqd_0006 (it drops three indexes from cairnq_tasks, which takes the
        # table's strongest lock), with the indexes back for it to drop.
        _sql(pg_target, "delete from cairnqd_migrations where name like 'cairnqd_0006%'")
        for name, columns in (
            ("cairnqd_tasks_created_idx", "created_at_ms, id"),
            ("cairnqd_tasks_status_created_idx", "status, created_at_ms, id"),
            ("cairnqd_tasks_run_at_idx", "run_at_ms, id"),
        ):
            _sql(pg_target, f"create index {name} on cairnq_tasks ({columns})")

        # A long transaction holding a row of the task table: the drop must wait for it.
        blocker = await psycopg.AsyncConnection.connect(pg_target)
        await blocker.execute("update cairnq_tasks set priority = priority where id in "
                              "(select id from cairnq_tasks limit 1)")  # fmt: skip
        migrator = PostgresStore(pg_target)
        migrating = asyncio.create_task(migrator.connect())
        slowest = 0.0
        claimed = 0
        until = time.monotonic() + 3.0
        while time.monotonic() < until:
            began = time.monotonic()
            claimed += len(await worker.claim(queues=["default"], worker_id="w", limit=1))
            slowest = max(slowest, time.monotonic() - began)
            await asyncio.sleep(0.02)
        assert not migrating.done()  # still waiting for the blocker, politely
        await blocker.commit()
        await blocker.close()
        await asyncio.wait_for(migrating, 30)
        await migrator.close()
    finally:
        await worker.close()
    # Without the lock timeout every claim would have queued behind the drop for the whole
    # 3 s; with it, a claim waits at most one lock timeout (plus a wide margin for CI).
    assert claimed > 20
    assert slowest < 0.3 + 1.2, slowest
    assert any("a lock was not free within 300 ms" in r.message for r in caplog.records)
    assert (
        _sql(pg_target, "select 1 from pg_class where relname = 'cairnqd_tasks_run_at_idx'") == []
    )
    assert _sql(pg_target, "select 1 from cairnqd_migrations where name like 'cairnqd_0006%'")


async def test_one_lock_wait_is_said_and_a_second_is_warned_about(
    pg_target: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Processes that start together migrate together, and a concurrent index build
    waits for every transaction under way: one wait past the lock timeout is expected
    on a busy machine and logs at INFO; a second in a row is a WARNING."""
    monkeypatch.setattr(pg_migrate, "LOCK_TIMEOUT_MS", 200)
    # Pauses wide enough that the blocker goes before the next try on a loaded machine.
    monkeypatch.setattr(pg_migrate, "_FIRST_PAUSE_S", 2.0)
    caplog.set_level(logging.INFO, "cairnqd.migrate")
    async with PostgresStore(pg_target):
        pass

    def waits() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "a lock was not free" in r.message]

    def waited(times: int) -> bool:
        return len(waits()) >= times

    for held_for_waits in (1, 2):
        caplog.clear()
        _sql(pg_target, "delete from cairnqd_migrations where name like 'cairnqd_0007%'")
        blocker = await psycopg.AsyncConnection.connect(pg_target)
        await blocker.execute("lock table cairnqd_migrations in exclusive mode")
        migrator = PostgresStore(pg_target)
        migrating = asyncio.create_task(migrator.connect())
        try:
            await wait_for_async(
                f"{held_for_waits} lock wait(s)", functools.partial(waited, held_for_waits)
            )
        finally:
            await blocker.rollback()
            await blocker.close()
        await asyncio.wait_for(migrating, 30)
        await migrator.close()
        levels = [r.levelno for r in waits()]
        assert levels == [logging.INFO, logging.WARNING][:held_for_waits], levels
        assert _sql(pg_target, "select 1 from cairnqd_migrations where name like 'cairnqd_0007%'")


async def test_a_migration_blocked_past_every_attempt_fails_and_applies_nothing(
    pg_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_migrate, "LOCK_TIMEOUT_MS", 100)
    monkeypatch.setattr(pg_migrate, "LOCK_ATTEMPTS", 3)
    monkeypatch.setattr(pg_migrate, "_FIRST_PAUSE_S", 0.05)
    async with PostgresStore(pg_target):
        pass
    _sql(pg_target, "delete from cairnqd_migrations where name like 'cairnqd_0007%'")
    blocker = await psycopg.AsyncConnection.connect(pg_target)
    try:
        await blocker.execute("lock table cairnqd_migrations in exclusive mode")
        with pytest.raises(pg_migrate.MigrationBlocked, match=r"cairnqd_0007_fleet\.sql"):
            await PostgresStore(pg_target).connect()
    finally:
        await blocker.rollback()
        await blocker.close()
    assert not _sql(pg_target, "select 1 from cairnqd_migrations where name like 'cairnqd_0007%'")
    # Once nothing is missing, a process that starts takes no lock: the same lock held
    # does not hold it up.
    async with PostgresStore(pg_target):
        pass
    blocker = await psycopg.AsyncConnection.connect(pg_target)
    try:
        await blocker.execute("lock table cairnqd_migrations in exclusive mode")
        async with asyncio.timeout(10), PostgresStore(pg_target) as store:
            assert await store.stats() == {}
    finally:
        await blocker.rollback()
        await blocker.close()
