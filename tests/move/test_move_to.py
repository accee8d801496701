"""`cairnqd move-to`: a SQLite file copied into a fresh Postgres database per test,
through the real command line, and checked row by row on the target."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from cairnqd.context import TaskContext
from cairnqd.store.arguments import SubmitRequest
from cairnqd.store.move import SKIPPED, TABLES, RowText
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite.migrate import apply_sqlite
from cairnqd.store.tables.schedules import ScheduleTable
from cairnqd.worker import Worker
from tests.support.cli import REPO_ENV, cli, database_line, running_daemon, write_config
from tests.support.daemon import Daemon, base_config
from tests.support.databases import PgDatabases
from tests.support.harness import database_section, stats
from tests.support.moving import SCHEDULE, Source, add_bulk, differences, populate
from tests.support.waiting import wait_for, wait_for_async

pytestmark = pytest.mark.postgres


@pytest.fixture
def source(tmp_path: Path) -> tuple[Path, Source]:
    """A config on a SQLite file holding a bit of everything."""
    db = tmp_path / "tasks.db"
    made = populate(str(db))
    return write_config(tmp_path, database_line("sqlite", str(db))), made


def _scalar(dsn: str, sql: str) -> object:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql).fetchone()  # type: ignore[arg-type]
        return None if row is None else row[0]


def _has_tasks_table(dsn: str) -> bool:
    return bool(_scalar(dsn, "select to_regclass('cairnq_tasks') is not null"))


def test_every_table_of_the_sqlite_schema_is_moved_or_skipped_on_purpose(
    tmp_path: Path, pg_databases: PgDatabases
) -> None:
    """A table added by a future migration fails here until TABLES or SKIPPED names it."""
    conn = sqlite3.connect(tmp_path / "fresh.db", isolation_level=None)
    try:
        apply_sqlite(conn)
        tables = {
            r[0]
            for r in conn.execute(
                "select name from sqlite_schema where type = 'table' and name not like 'sqlite_%'"
            )
        }
    finally:
        conn.close()
    moved = {t.name for t in TABLES}
    assert not moved & set(SKIPPED)
    assert tables - moved - set(SKIPPED) == set(), "neither moved nor skipped"
    assert moved <= tables
    # Every moved table exists on a migrated Postgres database.
    dsn = pg_databases.new()
    asyncio.run(_migrate(dsn))
    for table in moved:
        assert _scalar(dsn, f"select to_regclass('{table}') is not null"), table


def test_every_row_arrives_and_the_target_carries_on(
    source: tuple[Path, Source], pg_databases: PgDatabases
) -> None:
    config, made = source
    dsn = pg_databases.new()
    moved = cli(config, "move-to", dsn, "--batch", "4")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    last = moved.stdout.strip().splitlines()[-1]
    assert last.startswith("moved 15 tasks") and last.endswith(": verified"), last
    assert "3 running at the source settled" in last
    # Row by row: equal, except the running tasks and their open attempts.
    running = frozenset(made.running)
    for table in TABLES:
        assert differences(made.path, dsn, table.name, except_ids=running) == [], table.name
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "select id, status, attempt, worker_id, lease_until_ms, error->>'code', progress "
            "from cairnq_tasks where id = any(%s)",
            (made.running,),
        ).fetchall()
        settled = {r[0]: r[1:] for r in rows}
        outcomes = dict(
            conn.execute(
                "select task_id, outcome from cairnqd_attempts where task_id = any(%s)",
                (made.running,),
            ).fetchall()
        )
    out, again, cancel_pending = made.running
    assert settled[out][:2] == ("failed", 1) and settled[out][4] == "lease_expired"
    assert settled[again] == ("queued", 1, None, None, None, None)
    assert settled[cancel_pending][0] == "canceled"
    assert all(s[3] is None for s in settled.values()), "a lease arrived"
    assert outcomes == {out: "lease_lost", again: "lease_lost", cancel_pending: "canceled"}

    async def carry_on() -> None:
        store = PostgresStore(dsn, max_size=2)
        await store.connect()
        try:
            # A keyed resubmit reuses the task the key named at the source.
            reused = await store.submit(name="job.keyed", key="key-reuse", queue="a")
            assert reused.id == made.keys["reuse"]
            # The schedule's last slot was fired at the source: not again; the next once.
            table = ScheduleTable(store)
            request = SubmitRequest(name="job.nightly", queue="a", key=f"{SCHEDULE}:next")
            now = made.last_slot_ms + 60_000
            assert (
                await table.fire(SCHEDULE, made.last_slot_ms, request, host="h", at_ms=now) is None
            )
            nxt = made.last_slot_ms + 60_000
            assert await table.fire(SCHEDULE, nxt, request, host="h", at_ms=now) is not None
            assert await table.fire(SCHEDULE, nxt, request, host="h", at_ms=now) is None
            # The pause came along.
            assert [p.queue for p in await store.pauses.all()] == ["b"]
        finally:
            await store.close()
        # A worker on the target drains what was queued (and due) in a and c.
        worker = Worker.postgres(dsn, queues=["a", "c"], concurrency=4, poll_interval_ms=50)
        ran: list[str] = []

        async def handle(ctx: TaskContext, payload: object = None) -> None:
            ran.append(ctx.task_id)

        for name in ("job.queued", "job.keyed", "job.again", "job.nightly"):
            worker.register(name, handle)
        runner = asyncio.create_task(worker.run())
        expected = {*made.ids["queued"], *made.keys.values(), again}
        try:
            await wait_for_async("the worker to drain a and c", lambda: expected <= set(ran))
        finally:
            worker.stop()
            await asyncio.wait_for(runner, 30)
        check = PostgresStore(dsn, max_size=2)
        await check.connect()
        try:
            stats = await check.stats()
            assert stats["a"]["queued"] == 0 and stats["c"]["queued"] == 0, stats
            assert stats["a"]["running"] == 0 and stats["c"]["running"] == 0, stats
        finally:
            await check.close()

    asyncio.run(carry_on())


def _progress(dsn: str) -> int:
    try:
        value = _scalar(
            dsn,
            "select coalesce(sum(moved), 0) from cairnqd_moves where table_name = 'cairnq_tasks'",
        )
    except psycopg.errors.UndefinedTable:
        return 0
    return int(value or 0)  # type: ignore[call-overload]


def test_a_move_killed_halfway_completes_on_a_rerun_without_duplicates(
    source: tuple[Path, Source], pg_databases: PgDatabases
) -> None:
    config, made = source
    add_bulk(made.path, 5_000)
    dsn = pg_databases.new()
    asyncio.run(_migrate(dsn))
    with sqlite3.connect(made.path) as conn:
        ids = [r[0] for r in conn.execute("select id from cairnq_tasks order by id")]
    # An uncommitted insert of the 1,001st id holds the move inside its 51st batch (of
    # 20), so the kill lands halfway through the table whatever the machine's speed.
    blocker = psycopg.connect(dsn)
    blocker.execute(
        "insert into cairnq_tasks (id, name, queue, status, payload, run_at_ms, "
        "created_at_ms, updated_at_ms) values (%s, 'x', 'x', 'queued', '{}', 1, 1, 1)",
        (ids[1_000],),
    )
    argv = ["-m", "cairnqd.cli", "-c", str(config), "move-to", dsn, "--batch", "20"]
    try:
        proc = subprocess.Popen(
            [sys.executable, *argv],
            cwd=config.parent,
            env=REPO_ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for("1,000 tasks moved", lambda: _progress(dsn) >= 1_000, timeout=60)
            wait_for("the move to wait on the held id", lambda: _waiting_on_a_lock(dsn))
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(timeout=30)
    finally:
        blocker.rollback()
        blocker.close()
    assert _progress(dsn) == 1_000
    assert _scalar(dsn, "select count(*) from cairnq_tasks") == 1_000
    rerun = cli(config, "move-to", dsn, "--batch", "500")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert rerun.stdout.strip().endswith(": verified"), rerun.stdout
    assert "resuming" in rerun.stdout
    assert _scalar(dsn, "select count(*) from cairnq_tasks") == 5_015
    # The attempt history has no key on Postgres: duplicates would show in the count.
    assert _scalar(dsn, "select count(*) from cairnqd_attempts") == 6
    assert differences(made.path, dsn, "cairnq_task_keys") == []


async def _migrate(dsn: str) -> None:
    store = PostgresStore(dsn, max_size=2)
    await store.connect()
    await store.close()


def _waiting_on_a_lock(dsn: str) -> bool:
    return bool(
        _scalar(
            dsn,
            "select count(*) from pg_stat_activity where datname = current_database() "
            "and wait_event_type = 'Lock' and query ilike 'copy%'",
        )
    )


def test_a_target_holding_tasks_is_refused_unless_merging(
    source: tuple[Path, Source], pg_databases: PgDatabases
) -> None:
    config, made = source
    dsn = pg_databases.new()
    kept_id = made.ids["queued"][0]

    async def occupy() -> str:
        store = PostgresStore(dsn, max_size=2)
        await store.connect()
        try:
            task = await store.submit(name="job.theirs", payload={"t": 1}, queue="z")
        finally:
            await store.close()
        return task.id

    theirs = asyncio.run(occupy())
    with psycopg.connect(dsn) as conn:
        # One of the source's ids already there, with another payload.
        conn.execute(
            "insert into cairnq_tasks (id, name, queue, status, payload, run_at_ms, "
            "created_at_ms, updated_at_ms) values (%s, 'job.mine', 'a', 'queued', "
            "'{\"kept\": true}', 1, 1, 1)",
            (kept_id,),
        )
    refused = cli(config, "move-to", dsn)
    assert refused.returncode == 65, refused.stdout + refused.stderr
    assert "already holds 2 tasks" in refused.stderr and "--merge" in refused.stderr
    assert _scalar(dsn, "select count(*) from cairnq_tasks") == 2
    merged = cli(config, "move-to", dsn, "--merge", "--batch", "5")
    assert merged.returncode == 0, merged.stdout + merged.stderr
    last = merged.stdout.strip().splitlines()[-1]
    assert "moved 14 tasks" in last and "1 tasks already on the target kept" in last, last
    assert last.endswith(": verified"), last
    assert _scalar(dsn, "select count(*) from cairnq_tasks") == 16
    assert _scalar(dsn, f"select payload->>'kept' from cairnq_tasks where id = '{kept_id}'")
    assert _scalar(dsn, f"select name from cairnq_tasks where id = '{theirs}'") == "job.theirs"


def test_dry_run_writes_nothing(source: tuple[Path, Source], pg_databases: PgDatabases) -> None:
    config, _ = source
    dsn = pg_databases.new()
    dry = cli(config, "move-to", dsn, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "cairnq_tasks" in dry.stdout and " 15 " in dry.stdout
    assert "cairnqd_fleet" in dry.stdout and "skipped" in dry.stdout
    assert dry.stdout.strip().endswith("dry run; nothing was written")
    assert not _has_tasks_table(dsn)


def test_unreachable_target_is_a_clear_error(source: tuple[Path, Source]) -> None:
    config, made = source
    before = Path(made.path).read_bytes()
    out = cli(config, "move-to", "postgresql://postgres@127.0.0.1:1/nowhere")
    assert out.returncode == 69, out.stderr
    assert "cannot connect to Postgres at postgresql://postgres@127.0.0.1:1/nowhere" in out.stderr
    assert "nothing was written" in out.stderr
    assert Path(made.path).read_bytes() == before


def test_a_target_at_another_protocol_version_is_refused(
    source: tuple[Path, Source], pg_databases: PgDatabases
) -> None:
    config, _ = source
    dsn = pg_databases.new()
    with psycopg.connect(dsn) as conn:
        conn.execute("create table cairnq_meta (key text primary key, value text not null)")
        conn.execute("insert into cairnq_meta values ('protocol_version', '2')")
    out = cli(config, "move-to", dsn)
    assert out.returncode == 65, out.stderr
    assert "protocol_version=2, cairnqd supports 1" in out.stderr
    assert not _has_tasks_table(dsn)


def test_a_live_daemon_on_the_source_is_refused(
    source: tuple[Path, Source], pg_databases: PgDatabases
) -> None:
    config, made = source
    dsn = pg_databases.new()
    now = int(time.time() * 1000)
    with sqlite3.connect(made.path) as conn:
        conn.execute(
            "insert into cairnqd_fleet (daemon, host, pid, config, version, pipe_protocol, "
            "features, groups, started_at_ms, seen_at_ms) values ('live-one', 'h2', 42, "
            "'/etc/c.yaml', '0.1', 1, '[]', '[]', ?, ?)",
            (now, now),
        )
    out = cli(config, "move-to", dsn)
    assert out.returncode == 75, out.stderr
    assert "daemon live-one (host h2, pid 42) is live in the fleet registry" in out.stderr
    assert "--live" in out.stderr
    assert not _has_tasks_table(dsn)


def test_bad_command_lines_name_what_is_wrong(source: tuple[Path, Source], tmp_path: Path) -> None:
    config, _ = source
    neither = cli(config, "move-to")
    assert neither.returncode == 64 and "DSN or as --to-config" in neither.stderr
    bad = cli(config, "move-to", "mysql://x")
    assert bad.returncode == 64 and "move-to DSN: unsupported scheme" in bad.stderr
    (tmp_path / "other").mkdir()
    other = write_config(tmp_path / "other", database_line("sqlite", str(tmp_path / "x.db")))
    sqlite_target = cli(config, "move-to", "--to-config", str(other))
    assert sqlite_target.returncode == 64
    assert "names a SQLite path" in sqlite_target.stderr
    assert cli(config, "move-to", "postgresql://x/y", "--batch", "0").returncode == 64


def _source_status(path: Path, task_id: str) -> str | None:
    with sqlite3.connect(path) as conn:
        row = conn.execute("select status from cairnq_tasks where id = ?", (task_id,)).fetchone()
    return None if row is None else str(row[0])


@pytest.mark.slow
def test_live_move_beside_a_running_daemon_loses_nothing(
    tmp_path: Path, pg_databases: PgDatabases
) -> None:
    db = tmp_path / "tasks.db"
    config = write_config(tmp_path, database_line("sqlite", str(db)))
    assert cli(config, "migrate").returncode == 0
    dsn = pg_databases.new()
    with running_daemon(config, tmp_path, env=REPO_ENV):
        echoes = []
        for i in range(5):
            submitted = cli(config, "submit", "demo.echo", "--payload", f'{{"i": {i}}}')
            assert submitted.returncode == 0, submitted.stderr
            echoes.append(submitted.stdout.strip())
        for task_id in echoes:
            wait_for("the echoes to finish", lambda t=task_id: _source_status(db, t) == "succeeded")
        refused = cli(config, "move-to", dsn)
        assert refused.returncode == 75, refused.stderr
        assert "a daemon runs on the source" in refused.stderr
        slow = cli(config, "submit", "demo.sleep", "--payload", '{"seconds": 6}')
        assert slow.returncode == 0, slow.stderr
        slow_id = slow.stdout.strip()
        wait_for("the slow task to run", lambda: _source_status(db, slow_id) == "running")
        moved = cli(config, "move-to", "--live", dsn, "--live-timeout", "60")
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert "move: paused 2 queues at the source (default, mail)" in moved.stdout
        assert "waiting for 1 running tasks" in moved.stdout
        assert moved.stdout.splitlines()[-2].startswith("moved 6 tasks")
        assert moved.stdout.splitlines()[-2].endswith(": verified")
        assert "resume --queue default --queue mail" in moved.stdout.splitlines()[-1]
    with psycopg.connect(dsn) as conn:
        assert conn.execute(
            "select status from cairnq_tasks where id = %s", (slow_id,)
        ).fetchone() == ("succeeded",)
        assert conn.execute("select count(*) from cairnq_tasks").fetchone() == (6,)
        pauses = {r[0] for r in conn.execute("select queue from cairnqd_queue_pauses")}
    assert pauses == {"default", "mail"}
    with sqlite3.connect(db) as conn:
        assert {r[0] for r in conn.execute("select queue from cairnqd_queue_pauses")} == pauses
    for table in TABLES:
        assert differences(str(db), dsn, table.name) == [], table.name


def test_two_runs_of_one_move_never_write_together(
    source: tuple[Path, Source], pg_databases: PgDatabases
) -> None:
    config, made = source
    dsn = pg_databases.new()
    with psycopg.connect(dsn, autocommit=True) as holder:
        # What a first run holds while it copies.
        holder.execute(
            "select pg_advisory_lock(%s::integer, hashtext(%s))", (0x63716D76, made.path)
        )
        second = cli(config, "move-to", dsn)
    assert second.returncode == 65, second.stderr
    assert f"another move of {made.path} into" in second.stderr
    assert not _has_tasks_table(dsn)


def test_the_target_can_come_from_another_config(
    source: tuple[Path, Source], pg_databases: PgDatabases, tmp_path: Path
) -> None:
    config, _ = source
    dsn = pg_databases.new()
    (tmp_path / "pg").mkdir()
    target = write_config(tmp_path / "pg", database_line("postgres", dsn))
    moved = cli(config, "move-to", "--to-config", str(target))
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert moved.stdout.strip().endswith(": verified")
    assert _scalar(dsn, "select count(*) from cairnq_tasks") == 15


def test_the_verification_names_a_row_that_differs(
    source: tuple[Path, Source], pg_databases: PgDatabases
) -> None:
    config, made = source
    dsn = pg_databases.new()
    assert cli(config, "move-to", dsn, "--batch", "4").returncode == 0
    changed = made.ids["succeeded"][0]
    with psycopg.connect(dsn) as conn:
        conn.execute("update cairnq_tasks set result = '{\"ok\": false}' where id = %s", (changed,))
    again = cli(config, "move-to", dsn, "--batch", "4")
    assert again.returncode == 65, again.stdout + again.stderr
    assert "cairnq_tasks batch " in again.stdout and "1 rows differ" in again.stdout
    assert f"the first with key ['{changed}']" in again.stdout
    assert again.stdout.strip().endswith("NOT verified, 1 differences")


def test_a_source_that_is_not_a_cairnq_database_is_refused(
    tmp_path: Path, pg_databases: PgDatabases
) -> None:
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table notes (id integer primary key, body text)")
    config = write_config(tmp_path, database_line("sqlite", str(db)))
    dsn = pg_databases.new()
    out = cli(config, "move-to", dsn)
    assert out.returncode == 65, out.stderr
    assert f"{db}: not a cairnq database" in out.stderr
    assert not _has_tasks_table(dsn)


def test_rows_read_back_from_either_side_write_out_the_same() -> None:
    text = RowText(["text", "jsonb", "double precision", "bigint", "jsonb"])
    from_sqlite = ("a\tb", '{"b": [1, 2.5], "a": "é"}', 0.5, 3, None)
    from_postgres = ("a\tb", {"a": "é", "b": [1, 2.5]}, 0.5, 3, None)
    assert text(from_sqlite) == text(from_postgres)
    assert text.checksum([from_sqlite]) == text.checksum([from_postgres])
    assert text.checksum([from_sqlite]) != text.checksum([None])
    assert text(from_sqlite) != text(("a\tb", '{"a": "e", "b": [1, 2.5]}', 0.5, 3, None))


def test_a_rerun_meeting_a_row_already_there_says_merge_would_skip_it(
    source: tuple[Path, Source], pg_databases: PgDatabases
) -> None:
    config, made = source
    dsn = pg_databases.new()
    assert cli(config, "move-to", dsn).returncode == 0
    add_bulk(made.path, 10)  # submitted at the source after the move
    with sqlite3.connect(made.path) as conn:
        (late,) = conn.execute("select max(id) from cairnq_tasks").fetchone()
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "insert into cairnq_tasks (id, name, queue, status, payload, run_at_ms, "
            "created_at_ms, updated_at_ms) values (%s, 'job.other', 'd', 'queued', '{}', 1, 1, 1)",
            (late,),
        )
    again = cli(config, "move-to", dsn)
    assert again.returncode == 65, again.stdout + again.stderr
    assert "already exists" in again.stderr and "give --merge to skip" in again.stderr
    merged = cli(config, "move-to", dsn, "--merge")
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "(1 tasks already on the target kept as they were)" in merged.stdout
    assert _scalar(dsn, "select count(*) from cairnq_tasks") == 25


async def _source_graph(path: str) -> dict[str, str]:
    """A graph mid-way: a parent done, a join waiting on it and on one still queued, a
    task below the join, and a dependent canceled by a failed parent."""
    from cairnqd.store.sqlite import SQLiteStore

    store = SQLiteStore(path)
    await store.connect()
    try:
        done, open_, join, below, failing, canceled = await store.submit_many(
            [
                {"name": "g.done", "queue": "g"},
                {"name": "g.open", "queue": "g"},
                {"name": "g.join", "queue": "g", "after": [0, 1]},
                {"name": "g.below", "queue": "g", "after": [2]},
                {"name": "g.failing", "queue": "g"},
                {"name": "g.canceled", "queue": "g", "after": [4]},
            ]
        )
        for task, settle in ((done, "complete"), (failing, "fail")):
            [claimed] = await store.claim(queues=["g"], worker_id="w", names=[task.name])
            if settle == "complete":
                await store.complete(task_id=claimed.id, worker_id="w", result={"r": 1})
            else:
                error = {"type": "E", "code": "boom", "message": "no", "retryable": False}
                await store.fail(task_id=claimed.id, worker_id="w", error=error, retryable=False)
        return {
            "open": open_.id, "join": join.id, "below": below.id,
            "failing": failing.id, "canceled": canceled.id,
        }  # fmt: skip
    finally:
        await store.close()


def test_a_dependency_graph_moves_mid_way_and_carries_on(
    tmp_path: Path, pg_databases: PgDatabases
) -> None:
    db = tmp_path / "graph.db"
    ids = asyncio.run(_source_graph(str(db)))
    config = write_config(tmp_path, database_line("sqlite", str(db)))
    dsn = pg_databases.new()
    moved = cli(config, "move-to", dsn)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    for table in ("cairnqd_task_deps", "cairnqd_task_ancestors", "cairnqd_task_waits"):
        assert differences(str(db), dsn, table) == [], table

    async def carry_on() -> None:
        store = PostgresStore(dsn, max_size=2)
        await store.connect()
        try:
            assert await store.waiting_counts() == {"g": 2}
            [claimed] = await store.claim(queues=["g"], worker_id="t", limit=5)
            assert claimed.id == ids["open"], "only the open parent is due on the target"
            await store.complete(task_id=claimed.id, worker_id="t", result=None)
            [join] = await store.claim(queues=["g"], worker_id="t", limit=5)
            assert join.id == ids["join"], "its last parent, settled on the target, released it"
            canceled = await store.get(ids["canceled"])
            assert canceled is not None and canceled.error is not None
            assert canceled.error["code"] == "dependency_failed"
            await store.retry(ids["failing"])
            back = await store.get(ids["canceled"])
            assert back is not None and back.status == "queued" and back.error is None
        finally:
            await store.close()

    asyncio.run(carry_on())


def _spread_statuses(path: str) -> None:
    """Turn the bulk tasks into every status, each with what that status carries."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        now = int(time.time() * 1000)
        conn.execute("begin")
        conn.execute(
            "update cairnq_tasks set status = 'succeeded', attempt = 1, progress = 1.0, "
            "result = json_object('i', json_extract(payload, '$.i')), completed_at_ms = ?, "
            "updated_at_ms = ? where name = 'job.bulk' and rowid % 5 = 1",
            (now, now),
        )
        conn.execute(
            "update cairnq_tasks set status = 'failed', attempt = max_attempts, "
            "error = json_object('type', 'E', 'code', 'boom', 'message', 'no', "
            "'retryable', json('false')), completed_at_ms = ?, updated_at_ms = ? "
            "where name = 'job.bulk' and rowid % 5 = 2",
            (now, now),
        )
        conn.execute(
            "update cairnq_tasks set status = 'canceled', cancel_requested_at_ms = ?, "
            "completed_at_ms = ?, updated_at_ms = ? where name = 'job.bulk' and rowid % 5 = 3",
            (now, now, now),
        )
        conn.execute("commit")
    finally:
        conn.close()


@pytest.mark.slow
def test_a_hundred_thousand_tasks_in_every_status_arrive_row_for_row(
    tmp_path: Path, pg_databases: PgDatabases
) -> None:
    db = tmp_path / "big.db"
    made = populate(str(db), bulk=100_000)
    _spread_statuses(str(db))
    config = write_config(tmp_path, database_line("sqlite", str(db)))
    dsn = pg_databases.new()
    moved = cli(config, "move-to", dsn)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    last = moved.stdout.strip().splitlines()[-1]
    assert last.startswith("moved 100015 tasks") and last.endswith(": verified"), last
    running = frozenset(made.running)
    for table in TABLES:
        assert differences(made.path, dsn, table.name, except_ids=running) == [], table.name
    with psycopg.connect(dsn) as conn:
        statuses = dict(
            conn.execute(
                "select status, count(*) from cairnq_tasks where name = 'job.bulk' group by 1"
            ).fetchall()
        )
    assert statuses == {"queued": 40_000, "succeeded": 20_000, "failed": 20_000, "canceled": 20_000}


@pytest.mark.slow
def test_a_daemon_on_the_target_drains_what_was_queued(
    source: tuple[Path, Source], pg_databases: PgDatabases, tmp_path: Path
) -> None:
    config, made = source
    add_bulk(made.path, 2_000)
    dsn = pg_databases.new()
    moved = cli(config, "move-to", dsn)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    home = tmp_path / "target"
    home.mkdir()
    groups = {"g": {"queues": ["a", "c", "d"], "processes": 2, "concurrency": 8}}
    daemon_config = base_config(home, database_section("postgres", dsn), groups)
    daemon_config["handlers"] = ["tests.move.move_handlers:registry"]
    daemon = Daemon(home, daemon_config).start()
    try:

        def drained() -> dict[str, dict[str, int]] | None:
            counts = stats("postgres", dsn)
            busy = any(counts[q]["queued"] + counts[q]["running"] for q in ("a", "c", "d"))
            return None if busy else counts

        counts = wait_for("the daemon to drain a, c and d", drained, 60)
        assert counts["d"]["succeeded"] == 2_000
        assert counts["b"]["queued"] == 1, "the paused queue's task waits, as it did"
    finally:
        assert daemon.stop() == 0
