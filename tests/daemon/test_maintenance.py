"""cairnqd.daemon.parent.maintenance against real databases: the reaper, hand-backs and the purge.

The test's own store plays the other processes (a worker that died outside the daemon,
an operator cancelling); the Maintenance under test opens its own store, either on the
test's loop (duties awaited directly) or on its thread (`start()`).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cairnqd.config import Config
from cairnqd.daemon.parent.maintenance import PURGE_LOCK_ID, Maintenance
from cairnqd.daemon.parent.metrics import Metrics
from cairnqd.daemon.parent.parent_store import db_error_kind
from cairnqd.errors import DatabaseUnavailable
from cairnqd.store.base import Clock, Row, TaskStore
from cairnqd.store.factory import store_for
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore
from tests.support.databases import make_store
from tests.support.harness import daemon_config
from tests.support.store import ShiftedClock
from tests.support.waiting import wait_for
from tests.support.worker import eventually

RULES = [
    {"status": "succeeded", "queue": "default", "older_than": "1s"},
    {"status": "canceled", "older_than": "1s"},
    {"status": "failed", "older_than": "1h"},
]


@pytest.fixture
async def store(dialect: str, db_target: str) -> AsyncIterator[TaskStore]:
    s = make_store(dialect, db_target)
    await s.connect()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def closing() -> Iterator[list[Maintenance | Metrics]]:
    """Stops every Maintenance (thread) and Metrics a test made, even when it fails."""
    made: list[Maintenance | Metrics] = []
    yield made
    for thing in made:
        if isinstance(thing, Maintenance):
            thing.stop(10)
        else:
            thing.close()


def make(
    closing: list[Maintenance | Metrics], config: Config, *, clock: Clock | None = None
) -> tuple[Maintenance, Metrics]:
    """A Maintenance on its own store; `clock` is that store's (rows look older to it
    when the clock runs ahead)."""
    metrics = Metrics(config)

    def clocked_store() -> TaskStore:
        return store_for(config.database, "background", clock=clock)

    maintenance = Maintenance(config, metrics, store_factory=clocked_store if clock else None)
    closing.extend([maintenance, metrics])
    return maintenance, metrics


def ahead(ms: int) -> ShiftedClock:
    """A maintenance clock `ms` ahead of the rows the test's own store writes."""
    return ShiftedClock(offset_ms=ms)


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


async def counted(metrics: Metrics, n: float, **labels: str) -> None:
    """Wait until the maintenance thread has counted `n` lease recoveries with `labels`:
    it counts after the statement commits, so a test that saw the rows change may
    still be ahead of the count."""

    async def reached() -> bool:
        return sample(metrics, "cairnq_lease_recoveries_total", **labels) == n

    await eventually(reached)


async def claimed(store: TaskStore, queue: str, worker_id: str, **submit: Any) -> str:
    task = await store.submit(name="demo.echo", queue=queue, **submit)
    (got,) = await store.claim(queues=[queue], worker_id=worker_id, lease_ms=60_000)
    assert got.id == task.id
    return task.id


async def status_of(store: TaskStore, task_id: str) -> str | None:
    task = await store.get(task_id)
    return None if task is None else task.status


async def finished(store: TaskStore, queue: str, status: str) -> str:
    """A task of `queue` ended `status` now (its completed_at is this instant)."""
    if status == "canceled":
        task = await store.submit(name="demo.echo", queue=queue)
        await store.cancel(task.id)
        return task.id
    task_id = await claimed(store, queue, "w-done")
    if status == "succeeded":
        await store.complete(task_id=task_id, worker_id="w-done", result=None)
    else:
        error = {"type": "E", "code": "e", "message": "boom", "retryable": False}
        await store.fail(task_id=task_id, worker_id="w-done", error=error, retryable=False)
    return task_id


def config_for(tmp_path: Path, dialect: str, target: str, **sections: Any) -> Config:
    defaults: dict[str, Any] = {
        "retention": {"interval": "1h", "rules": RULES},
        "reaper": {"interval": "1h"},
    }
    return daemon_config(tmp_path, dialect, target, **{**defaults, **sections})


# -- the reaper ------------------------------------------------------------------------------------


async def test_reaper_recovers_a_lease_left_by_a_dead_process(
    dialect: str, db_target: str, store: TaskStore, tmp_path: Path, closing: list[Any]
) -> None:
    task = await store.submit(name="demo.echo", queue="orphans")
    (got,) = await store.claim(queues=["orphans"], worker_id="gone:1", lease_ms=50)
    assert got.id == task.id
    await eventually(lambda: _expired(store))  # the process never comes back

    maintenance, metrics = make(closing, config_for(tmp_path, dialect, db_target))
    assert await maintenance.reap_once() == 1
    recovered = await store.get(task.id)
    assert recovered is not None and recovered.status == "queued"
    assert recovered.worker_id is None and recovered.attempt == 1
    assert sample(metrics, "cairnq_lease_recoveries_total", queue="orphans", reason="expired") == 1
    assert await maintenance.reap_once() == 0
    await maintenance.aclose()


async def _expired(store: TaskStore) -> bool:
    return bool(await store.expired_leases())


async def test_reaper_runs_at_start_on_its_thread(
    dialect: str, db_target: str, store: TaskStore, tmp_path: Path, closing: list[Any]
) -> None:
    task = await store.submit(name="demo.echo", queue="orphans", max_attempts=1)
    await store.claim(queues=["orphans"], worker_id="gone:2", lease_ms=50)
    await eventually(lambda: _expired(store))
    maintenance, metrics = make(closing, config_for(tmp_path, dialect, db_target))
    maintenance.start()
    maintenance.start()  # idempotent
    await eventually(lambda: _status_is(store, task.id, "failed"))
    failed = await store.get(task.id)
    assert failed is not None and failed.error is not None
    assert failed.error["code"] == "lease_expired"
    # The row commits before the maintenance thread counts it: wait for the count.
    await counted(metrics, 1, queue="orphans", reason="expired")
    assert maintenance.stop(10)
    assert maintenance.stop(10)  # idempotent


async def _status_is(store: TaskStore, task_id: str, status: str) -> bool:
    return await status_of(store, task_id) == status


# -- hand-back -------------------------------------------------------------------------------------


@pytest.mark.timing
async def test_hand_back_releases_exactly_that_workers_tasks(
    dialect: str, db_target: str, store: TaskStore, tmp_path: Path, closing: list[Any]
) -> None:
    retry = await claimed(store, "h1", "host:default.0:A")
    cancel = await claimed(store, "h2", "host:default.0:A")
    await store.cancel(cancel)  # requested while running: cancel wins at hand-back
    last = await claimed(store, "h3", "host:default.0:A", max_attempts=1)
    other = await claimed(store, "h1", "host:default.1:B")

    maintenance, metrics = make(closing, config_for(tmp_path, dialect, db_target))
    maintenance.start()
    started = time.monotonic()
    maintenance.hand_back("host:default.0:A", "worker_exit")
    await eventually(lambda: _status_is(store, last, "failed"), within=5)
    # Immediately: no lease (60 s) had to expire.
    assert time.monotonic() - started < 5

    queued = await store.get(retry)
    assert queued is not None and queued.status == "queued"
    assert queued.worker_id is None and queued.attempt == 1
    assert await status_of(store, cancel) == "canceled"
    failed = await store.get(last)
    assert failed is not None and failed.error is not None
    assert failed.error["code"] == "lease_expired"
    assert "(worker_exit)" in failed.error["message"]
    assert "exited" in failed.error["message"]
    untouched = await store.get(other)
    assert untouched is not None and untouched.status == "running"
    assert untouched.worker_id == "host:default.1:B"

    # The rows commit before the maintenance thread counts them: wait for the count.
    async def all_counted() -> bool:
        return all(
            sample(metrics, "cairnq_lease_recoveries_total", queue=q, reason="worker_exit") == 1
            for q in ("h1", "h2", "h3")
        )

    await eventually(all_counted, within=10)


async def test_stop_finishes_queued_hand_backs(
    dialect: str, db_target: str, store: TaskStore, tmp_path: Path, closing: list[Any]
) -> None:
    first = await claimed(store, "default", "host:default.0:C")
    second = await claimed(store, "email", "host:default.1:D")
    maintenance, metrics = make(closing, config_for(tmp_path, dialect, db_target))
    maintenance.start()
    maintenance.hand_back("host:default.0:C", "shutdown")
    maintenance.hand_back("host:default.1:D", "shutdown")
    # Shutdown's order: hand back the killed children, then stop maintenance.
    assert await asyncio.to_thread(maintenance.stop, 10)
    assert await status_of(store, first) == "queued"
    assert await status_of(store, second) == "queued"
    assert sample(metrics, "cairnq_lease_recoveries_total", queue="email", reason="shutdown") == 1
    with pytest.raises(ValueError):
        maintenance.hand_back("host:default.1:D", "because")


# Postgres: there a stop cuts a call on a silent database short (`TaskStore.sever`);
# SQLite's waits for its lock end by its own busy timeout.
@pytest.mark.parametrize("dialect", ["postgres"], indirect=True)
async def test_a_hand_back_the_stop_cuts_short_is_dropped_not_given_up(
    db_target: str,
    store: TaskStore,
    tmp_path: Path,
    closing: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stop while the database does not answer (a partition in production; here
    another session's lock): the hand-back under way is cut short with the rest, and
    said so once. Before, it was logged as an ERROR "giving up on", as if it had failed
    on its own."""
    await claimed(store, "default", "host:default.0:F")
    maintenance, _ = make(closing, config_for(tmp_path, "postgres", db_target))
    async with await psycopg.AsyncConnection.connect(db_target) as holder:
        await holder.execute("lock table cairnq_tasks in access exclusive mode")
        maintenance.hand_back("host:default.0:F", "shutdown")
        maintenance.start()  # a job queued before the start runs first
        # The hand-back is under way, waiting on the lock.
        await eventually(lambda: maintenance.pending_jobs() == 0)
        with caplog.at_level(logging.WARNING, logger="cairnqd"):
            await asyncio.to_thread(maintenance.stop, 2)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    dropped = [r.getMessage() for r in caplog.records if "job(s) dropped" in r.getMessage()]
    assert len(dropped) == 1 and "1 job(s) dropped" in dropped[0], caplog.text
    assert maintenance.pending_jobs() == 0  # said once: a second stop has none to drop


async def test_max_run_failure_then_hand_back(
    dialect: str, db_target: str, store: TaskStore, tmp_path: Path, closing: list[Any]
) -> None:
    overrun = await claimed(store, "default", "host:default.0:E")
    rest = await claimed(store, "email", "host:default.0:E")
    maintenance, metrics = make(closing, config_for(tmp_path, dialect, db_target))
    maintenance.fail_task_max_run(overrun, "host:default.0:E", 30)
    maintenance.hand_back("host:default.0:E", "max_run")
    maintenance.start()  # jobs queued before start run first, in order
    await eventually(lambda: _status_is(store, rest, "queued"))
    retried = await store.get(overrun)
    assert retried is not None and retried.status == "queued"
    assert retried.error is not None and retried.error["code"] == "max_run_exceeded"
    # Seen in CI: `rest` read as queued before the thread had counted it.
    await counted(metrics, 1, queue="default", reason="max_run")
    await counted(metrics, 1, queue="email", reason="max_run")


class FlakyStore(SQLiteStore):
    """A real SQLite store whose first hand-back meets a locked database."""

    failures = 1

    async def release_worker(
        self,
        worker_id: str,
        *,
        message: str,
        unstarted: Sequence[tuple[str, int]] = (),
        interrupted: Sequence[tuple[str, int]] = (),
        interruption_cap: int = 0,
        why: str = "worker_exit",
    ) -> list[Row]:
        if type(self).failures:
            type(self).failures -= 1
            raise sqlite3.OperationalError("database is locked")
        return await super().release_worker(
            worker_id,
            message=message,
            unstarted=unstarted,
            interrupted=interrupted,
            interruption_cap=interruption_cap,
            why=why,
        )


async def test_failed_hand_back_is_retried(
    sqlite_path: str, tmp_path: Path, closing: list[Any]
) -> None:
    store = SQLiteStore(sqlite_path)
    async with store:
        task_id = await claimed(store, "default", "host:default.0:F")
        config = config_for(tmp_path, "sqlite", sqlite_path)
        metrics = Metrics(config)
        flaky = type("Flaky", (FlakyStore,), {"failures": 1})
        maintenance = Maintenance(config, metrics, store_factory=lambda: flaky(sqlite_path))
        closing.extend([maintenance, metrics])
        maintenance.start()
        maintenance.hand_back("host:default.0:F", "worker_exit")
        await eventually(lambda: _status_is(store, task_id, "queued"))
        errors = sample(metrics, "cairnq_db_errors_total", component="maintenance", kind="busy")
        assert errors == 1


# -- purge ---------------------------------------------------------------------------------------


async def test_purge_deletes_only_what_the_rules_name(
    dialect: str, db_target: str, store: TaskStore, tmp_path: Path, closing: list[Any]
) -> None:
    old_default = await finished(store, "default", "succeeded")
    old_email = await finished(store, "email", "succeeded")  # rule 0 is default-only
    old_canceled = await finished(store, "email", "canceled")
    old_failed = await finished(store, "default", "failed")  # rule 2 keeps it an hour
    queued = (await store.submit(name="demo.echo", queue="live")).id
    running = await claimed(store, "email", "w-live")

    clock = ahead(0)
    maintenance, metrics = make(closing, config_for(tmp_path, dialect, db_target), clock=clock)
    before = sample(metrics, "cairnq_purge_last_success_timestamp_seconds")
    assert await maintenance.purge_once() == 0  # all younger than their rules
    clock.offset_ms = 1_100
    assert await maintenance.purge_once() == 2
    assert await status_of(store, old_default) is None
    assert await status_of(store, old_canceled) is None
    for kept in (old_email, old_failed, queued, running):
        assert await status_of(store, kept) is not None, kept
    assert sample(metrics, "cairnq_purge_deleted_total", rule="0") == 1
    assert sample(metrics, "cairnq_purge_deleted_total", rule="1") == 1
    assert sample(metrics, "cairnq_purge_deleted_total", rule="2") == 0
    assert sample(metrics, "cairnq_purge_runs_total") == 2
    assert sample(metrics, "cairnq_purge_failures_total") == 0
    assert sample(metrics, "cairnq_purge_last_success_timestamp_seconds") >= before
    await maintenance.aclose()


async def test_purge_batches_are_bounded_per_sweep(
    dialect: str, db_target: str, store: TaskStore, tmp_path: Path, closing: list[Any]
) -> None:
    ids = [await finished(store, "default", "canceled") for _ in range(7)]
    retention = {"interval": "1h", "batch": 2, "max_batches": 2, "rules": RULES}
    maintenance, metrics = make(
        closing, config_for(tmp_path, dialect, db_target, retention=retention), clock=ahead(1_100)
    )
    assert await maintenance.purge_once() == 4  # two full batches, then wait an interval
    assert await maintenance.purge_once() == 3  # the short batch ends the rule
    assert await maintenance.purge_once() == 0
    assert all([await status_of(store, i) is None for i in ids])
    assert sample(metrics, "cairnq_purge_runs_total") == 3
    await maintenance.aclose()


async def test_first_sweep_one_interval_after_start(
    dialect: str, db_target: str, store: TaskStore, tmp_path: Path, closing: list[Any]
) -> None:
    old = await finished(store, "default", "succeeded")
    orphan = await store.submit(name="demo.echo", queue="orphans")
    await store.claim(queues=["orphans"], worker_id="gone:3", lease_ms=50)
    await eventually(lambda: _expired(store))  # so the boot-time reaper has work
    retention = {"interval": "2s", "rules": RULES}
    # Old enough for its rule at once: a sweep at boot would delete it.
    maintenance, metrics = make(
        closing, config_for(tmp_path, dialect, db_target, retention=retention), clock=ahead(1_100)
    )
    started = time.monotonic()
    maintenance.start()
    # The boot-time reaper ran; the purge did not.
    await eventually(lambda: _status_is(store, orphan.id, "queued"))
    assert sample(metrics, "cairnq_purge_runs_total") == 0
    assert await status_of(store, old) is not None

    async def purged() -> bool:
        return await status_of(store, old) is None

    await eventually(purged)
    assert time.monotonic() - started >= 1.9
    assert sample(metrics, "cairnq_purge_runs_total") == 1


async def test_paused_purge_does_not_sweep(
    dialect: str, db_target: str, store: TaskStore, tmp_path: Path, closing: list[Any]
) -> None:
    old = await finished(store, "default", "succeeded")
    maintenance, metrics = make(
        closing, config_for(tmp_path, dialect, db_target), clock=ahead(1_100)
    )
    maintenance.pause_purge()
    assert await maintenance.purge_once() is None
    assert await status_of(store, old) is not None
    assert sample(metrics, "cairnq_purge_runs_total") == 0
    await maintenance.aclose()


# -- database errors -----------------------------------------------------------------------------


def test_database_errors_are_counted_and_the_loop_goes_on(
    tmp_path: Path, closing: list[Any]
) -> None:
    bad = tmp_path / "garbage.db"
    bad.write_bytes(b"not a database at all " * 200)
    config = config_for(tmp_path, "sqlite", str(bad), reaper={"interval": "1s"})
    maintenance, metrics = make(closing, config)
    maintenance.start()
    wait_for(
        "the reaper to retry",
        lambda: (
            sample(metrics, "cairnq_db_errors_total", component="maintenance", kind="other") >= 2
        ),
        10,
    )
    assert maintenance.stop(10)


def test_db_error_kinds() -> None:
    assert db_error_kind(sqlite3.OperationalError("database is locked")) == "busy"
    assert db_error_kind(TimeoutError()) == "timeout"
    assert db_error_kind(psycopg.errors.QueryCanceled("statement timeout")) == "timeout"
    assert db_error_kind(DatabaseUnavailable("down")) == "connect"
    assert db_error_kind(ValueError("x")) == "other"


# -- Postgres: one host sweeps -----------------------------------------------------------------


@pytest.fixture
async def pg_store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(pg_dsn, max_size=4)
    await s.connect()
    try:
        yield s
    finally:
        await s.close()


async def test_postgres_skips_the_sweep_while_another_session_holds_the_lock(
    pg_dsn: str, pg_store: PostgresStore, tmp_path: Path, closing: list[Any]
) -> None:
    old = await finished(pg_store, "default", "canceled")
    config = config_for(tmp_path, "postgres", pg_dsn)
    namespace = config.database.lock_namespace
    maintenance, metrics = make(closing, config, clock=ahead(1_100))
    with psycopg.connect(pg_dsn, autocommit=True) as other_host:
        other_host.execute("select pg_advisory_lock(%s, %s)", (namespace, PURGE_LOCK_ID))
        holder = other_host.info.backend_pid
        assert await maintenance.purge_once() is None
        assert await status_of(pg_store, old) is not None
        assert sample(metrics, "cairnq_purge_runs_total") == 0
    # The other host's session ended, and its lock with it, once the server's backend
    # has exited: that happens a moment after the client closes, later on a busy host.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:

        def holder_gone() -> bool:
            row = conn.execute("select count(*) from pg_stat_activity where pid = %s", (holder,))
            return row.fetchone() == (0,)

        wait_for("the other host's session to end on the server", holder_gone)
    assert await maintenance.purge_once() == 1
    assert await status_of(pg_store, old) is None
    await maintenance.aclose()


async def test_postgres_one_host_sweeps_per_interval_not_back_to_back(
    pg_dsn: str, pg_store: PostgresStore, tmp_path: Path, closing: list[Any]
) -> None:
    # Two hosts whose intervals are out of step: the second must not sweep right
    # after the first, only once an interval has passed since the first's turn.
    config = config_for(tmp_path, "postgres", pg_dsn)
    host_a, metrics_a = make(closing, config, clock=ahead(1_100))
    host_b, metrics_b = make(closing, config, clock=ahead(1_100))
    old = await finished(pg_store, "default", "canceled")
    assert await host_a.purge_turn() == 1
    newer = await finished(pg_store, "default", "canceled")
    assert await host_b.purge_turn() is None  # a's turn lasts the interval (1h)
    assert await host_a.purge_turn() is None  # and a's own next turn is not due either
    assert await status_of(pg_store, newer) is not None
    assert sample(metrics_a, "cairnq_purge_runs_total") == 1
    assert sample(metrics_b, "cairnq_purge_runs_total") == 0
    assert await status_of(pg_store, old) is None
    # purge_once, a sweep asked for directly, takes no turn.
    assert await host_b.purge_once() == 1
    await host_a.aclose()
    await host_b.aclose()


async def test_postgres_session_lock_is_in_the_two_key_space(
    pg_dsn: str, pg_store: PostgresStore
) -> None:
    async with pg_store.leadership.exclusive(1234, PURGE_LOCK_ID) as held:
        assert held
        async with pg_store.leadership.exclusive(1234, PURGE_LOCK_ID) as again:
            assert not again  # another session: never waits, just says no
        with psycopg.connect(pg_dsn) as conn:
            rows = conn.execute(
                "select classid::int, objid::int, objsubid from pg_locks "
                "where locktype = 'advisory' and granted"
            ).fetchall()
        assert (1234, PURGE_LOCK_ID, 2) in rows
    with psycopg.connect(pg_dsn) as conn:
        # This database's locks only: other suites may hold advisory locks on the server.
        left = conn.execute(
            "select count(*) from pg_locks where locktype = 'advisory' and database = "
            "(select oid from pg_database where datname = current_database())"
        )
        assert left.fetchone() == (0,)


async def test_postgres_two_hosts_purging_at_once_sweep_once(
    pg_dsn: str, pg_store: PostgresStore, tmp_path: Path, closing: list[Any]
) -> None:
    await pg_store.submit_many([{"name": "demo.echo", "queue": "bulk"} for _ in range(200)])
    for task in await pg_store.list(queue="bulk", limit=200):
        await pg_store.cancel(task.id)
    # Batches of one make the winner's sweep long enough to overlap the loser's try.
    retention = {"interval": "1h", "batch": 1, "max_batches": 1000, "rules": RULES}
    config = config_for(tmp_path, "postgres", pg_dsn, retention=retention)
    first, first_metrics = make(closing, config, clock=ahead(1_100))
    second, second_metrics = make(closing, config, clock=ahead(1_100))
    await first.reap_once()  # connect both stores first, so the race is the lock's
    await second.reap_once()
    results = await asyncio.gather(first.purge_once(), second.purge_once())
    assert sorted(results, key=lambda r: r is None) == [200, None]
    runs = [sample(m, "cairnq_purge_runs_total") for m in (first_metrics, second_metrics)]
    assert sorted(runs) == [0, 1]
    assert await pg_store.stats(queue="bulk") == {
        "bulk": dict.fromkeys(("queued", "running", "succeeded", "failed", "canceled"), 0)
    }
    await first.aclose()
    await second.aclose()
