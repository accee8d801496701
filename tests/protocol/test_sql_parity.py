"""Schema parity: our shared migrations build exactly what the public SDK builds.

The public `cairnq` 0.15.1 SDK migrates a database of its own; ours must hold the same
tables, columns, checks, indexes, triggers and functions, record the same ledger names
and meta rows, finish a database the other side started (both ways), and notify on the
same transitions. Anything we add lives in the cairnqd_ namespace and its own ledger.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tests.protocol.sqldb import (
    PgDatabases,
    pg_apply,
    pg_meta,
    pg_ours,
    pg_schema,
    pg_url,
    sqlite_apply,
    sqlite_connect,
    sqlite_ledger,
    sqlite_meta,
    sqlite_ours,
    sqlite_schema,
)
from tests.protocol.sqlfiles import migration_files


@pytest.fixture(scope="module")
def upstream_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cairnq = pytest.importorskip("cairnq")
    path = tmp_path_factory.mktemp("upstream") / "upstream.db"

    async def build() -> None:
        client = cairnq.CairnQ.sqlite(str(path))
        await client.connect()
        await client.close()

    asyncio.run(build())
    return path


@pytest.fixture(scope="module")
def upstream_pg(pg: PgDatabases) -> str:
    cairnq = pytest.importorskip("cairnq")
    name = pg.create("upstream")

    async def build() -> None:
        client = cairnq.CairnQ.postgres(pg_url(name), min_size=1, max_size=1)
        await client.connect()
        await client.close()

    asyncio.run(build())
    return name


def test_sqlite_schema_matches_upstream(upstream_sqlite: Path, tmp_path: Path) -> None:
    ours = sqlite_ours(tmp_path / "ours.db")
    theirs = sqlite_connect(upstream_sqlite)
    ours_schema, their_schema = sqlite_schema(ours), sqlite_schema(theirs)
    assert ours_schema["tables"].keys() == their_schema["tables"].keys()
    for table in their_schema["tables"]:
        assert ours_schema["tables"][table] == their_schema["tables"][table], table
    assert ours_schema["indexes"] == their_schema["indexes"]
    assert ours_schema["triggers"] == their_schema["triggers"] == []
    assert ours_schema == their_schema
    assert (
        sqlite_meta(ours)
        == sqlite_meta(theirs)
        == [
            ("protocol_version", "1"),
            ("schema_version", "10"),
        ]
    )
    assert sqlite_ledger(ours) == sqlite_ledger(theirs)
    assert "0003_notify.sql" not in sqlite_ledger(ours)
    # Everything else we add is ours by name and in our own ledger.
    extra = {r[0] for r in ours.execute("select name from sqlite_master")} - {
        r[0] for r in theirs.execute("select name from sqlite_master")
    }
    assert extra == {
        "cairnqd_migrations",
        "sqlite_autoindex_cairnqd_migrations_1",
        "cairnqd_task_keys_task_id_idx",
        "cairnqd_queue_pauses",
        "sqlite_autoindex_cairnqd_queue_pauses_1",
        "cairnqd_schedules",
        "sqlite_autoindex_cairnqd_schedules_1",
        "cairnqd_daemons",
        "sqlite_autoindex_cairnqd_daemons_1",
        "cairnqd_fleet",
        "sqlite_autoindex_cairnqd_fleet_1",
        "cairnqd_features",
        "sqlite_autoindex_cairnqd_features_1",
        "cairnqd_limit_slots",
        "sqlite_autoindex_cairnqd_limit_slots_1",
        "cairnqd_limit_overrides",
        "sqlite_autoindex_cairnqd_limit_overrides_1",
        "cairnqd_limit_bypasses",
        "sqlite_autoindex_cairnqd_limit_bypasses_1",
        "cairnqd_limit_workers",
        "sqlite_autoindex_cairnqd_limit_workers_1",
        "cairnqd_attempts",  # WITHOUT ROWID: its key is the table, no index of its own
        # The attempt history's triggers sit on the protocol's task table, by our names.
        "cairnqd_attempts_open",
        "cairnqd_attempts_close",
        "cairnqd_attempts_unstarted",
        "cairnqd_attempts_forget",
        "cairnqd_interruptions",
        "sqlite_autoindex_cairnqd_interruptions_1",
        "cairnqd_queue_counts",
        "sqlite_autoindex_cairnqd_queue_counts_1",
        "cairnqd_task_deps",
        "sqlite_autoindex_cairnqd_task_deps_1",
        "cairnqd_task_deps_parent_idx",
        "cairnqd_task_ancestors",
        "sqlite_autoindex_cairnqd_task_ancestors_1",
        "cairnqd_task_ancestors_ancestor_idx",
        "cairnqd_task_waits",
        "sqlite_autoindex_cairnqd_task_waits_1",
        "cairnqd_task_waits_failed_by_idx",
        "cairnqd_tasks_dependency_succeeded",
        "cairnqd_task_waits_released",
        "cairnqd_task_dep_moves",
        "cairnqd_tasks_dependency_moved",
        "cairnqd_task_dep_moves_failed",
        "cairnqd_task_dep_moves_retried",
        "cairnqd_tasks_dependency_deleted",
    }
    assert sqlite_ledger(ours, "cairnqd_migrations") == {
        "cairnqd_0001_task_keys_task_idx.sql",
        "cairnqd_0002_queue_pauses.sql",
        "cairnqd_0003_schedules.sql",
        "cairnqd_0004_dashboard.sql",
        "cairnqd_0006_dashboard_indexes_on_demand.sql",
        "cairnqd_0007_fleet.sql",
        "cairnqd_0008_limits.sql",
        "cairnqd_0009_limit_bypasses.sql",
        "cairnqd_0010_attempts.sql",
        "cairnqd_0011_interruptions.sql",
        "cairnqd_0012_queue_counts.sql",
        "cairnqd_0013_dependencies.sql",
        "cairnqd_0016_limit_workers.sql",
    }


def test_postgres_schema_matches_upstream(pg: PgDatabases, upstream_pg: str) -> None:
    ours_name = pg_ours(pg, "parity")
    with pg.connect(ours_name) as ours, pg.connect(upstream_pg) as theirs:
        ours_schema, their_schema = pg_schema(ours), pg_schema(theirs)
        for part in their_schema:
            assert ours_schema[part] == their_schema[part], part
        assert any(f[0] == "cairnq_notify" and f[2] == "trigger" for f in ours_schema["functions"])
        assert [t[1] for t in ours_schema["triggers"]] == ["cairnq_tasks_notify"]
        assert (
            pg_meta(ours)
            == pg_meta(theirs)
            == [("protocol_version", "1"), ("schema_version", "10")]
        )
        ledger = "select name from cairnq_migrations"
        ours_ledger = {r["name"] for r in ours.execute(ledger)}
        assert ours_ledger == {r["name"] for r in theirs.execute(ledger)}
        assert "0003_notify.sql" in ours_ledger
        assert {r["name"] for r in ours.execute("select name from cairnqd_migrations")} == {
            "cairnqd_0001_task_keys_task_idx.sql",
            "cairnqd_0002_queue_pauses.sql",
            "cairnqd_0003_schedules.sql",
            "cairnqd_0004_dashboard.sql",
            "cairnqd_0005_leases.sql",
            "cairnqd_0006_dashboard_indexes_on_demand.sql",
            "cairnqd_0007_fleet.sql",
            "cairnqd_0008_limits.sql",
            "cairnqd_0009_limit_bypasses.sql",
            "cairnqd_0010_attempts.sql",
            "cairnqd_0011_interruptions.sql",
            "cairnqd_0012_queue_counts.sql",
            "cairnqd_0013_dependencies.sql",
            "cairnqd_0014_moves.sql",
            "cairnqd_0015_trigger_plans.sql",
        }
        # Nothing of ours outside the cairnqd_ namespace.
        assert pg_schema(ours, skip_prefix=None)["indexes"] != ours_schema["indexes"]
        extra = set(pg_schema(ours, skip_prefix=None)["indexes"]) - set(their_schema["indexes"])
        assert {i[1] for i in extra} == {
            "cairnqd_migrations_pkey",
            "cairnqd_task_keys_task_id_idx",
            "cairnqd_queue_pauses_pkey",
            "cairnqd_schedules_pkey",
            "cairnqd_daemons_pkey",
            "cairnqd_leases_pkey",
            "cairnqd_fleet_pkey",
            "cairnqd_features_pkey",
            "cairnqd_limit_slots_pkey",
            "cairnqd_limit_overrides_pkey",
            "cairnqd_limit_bypasses_pkey",
            "cairnqd_interruptions_pkey",
            "cairnqd_queue_counts_pkey",
            "cairnqd_moves_pkey",
            "cairnqd_attempts_task_idx",
            "cairnqd_task_deps_pkey",
            "cairnqd_task_deps_parent_idx",
            "cairnqd_task_ancestors_pkey",
            "cairnqd_task_ancestors_ancestor_idx",
            "cairnqd_task_waits_pkey",
            "cairnqd_task_waits_failed_by_idx",
        }
        # Our triggers and their functions on the protocol's task table, ours by name:
        # the attempt history's and the dependencies'.
        everything = pg_schema(ours, skip_prefix=None)
        assert {t[1] for t in everything["triggers"]} - {
            t[1] for t in their_schema["triggers"]
        } == {
            "cairnqd_attempts_track",
            "cairnqd_attempts_forget",
            "cairnqd_tasks_dependencies",
            "cairnqd_tasks_dependencies_deleted",
        }
        assert {f[0] for f in everything["functions"]} - {
            f[0] for f in their_schema["functions"]
        } == {
            "cairnqd_attempts_track",
            "cairnqd_attempts_forget",
            "cairnqd_task_dependencies",
            "cairnqd_task_dependency_step",
            "cairnqd_task_dependencies_deleted",
        }


def _upstream_connect_sqlite(path: Path) -> None:
    cairnq = pytest.importorskip("cairnq")

    async def go() -> None:
        client = cairnq.CairnQ.sqlite(str(path))
        await client.connect()
        await client.close()

    asyncio.run(go())


def test_sqlite_migration_finished_by_the_other_side(upstream_sqlite: Path, tmp_path: Path) -> None:
    """Part-migrated by us, finished by upstream, and the reverse: same schema either way."""
    reference = sqlite_schema(sqlite_connect(upstream_sqlite))
    ours = sqlite_connect(tmp_path / "half.db")
    half = [p for p in migration_files("sqlite") if p.name < "0006"]
    sqlite_apply(ours, half, "cairnq")
    ours.close()
    _upstream_connect_sqlite(tmp_path / "half.db")
    finished = sqlite_connect(tmp_path / "half.db")
    assert sqlite_schema(finished) == reference
    assert sqlite_ledger(finished) == sqlite_ledger(sqlite_connect(upstream_sqlite))

    # Upstream's full database with its last three ledger rows lost: ours replays them.
    theirs = tmp_path / "theirs.db"
    theirs.write_bytes(upstream_sqlite.read_bytes())
    conn = sqlite_connect(theirs)
    conn.execute("delete from cairnq_migrations where name >= '0008'")
    missing = [p for p in migration_files("sqlite") if p.name >= "0008"]
    sqlite_apply(conn, missing, "cairnq")
    assert sqlite_schema(conn) == reference
    assert sqlite_meta(conn) == [("protocol_version", "1"), ("schema_version", "10")]
    conn.close()
    # And upstream accepts a database we created, without replaying anything.
    sqlite_ours(tmp_path / "ours.db").close()
    before = (
        sqlite_connect(tmp_path / "ours.db")
        .execute("select name, applied_at_ms from cairnq_migrations order by name")
        .fetchall()
    )
    _upstream_connect_sqlite(tmp_path / "ours.db")
    after = (
        sqlite_connect(tmp_path / "ours.db")
        .execute("select name, applied_at_ms from cairnq_migrations order by name")
        .fetchall()
    )
    assert [tuple(r) for r in after] == [tuple(r) for r in before]


def test_postgres_migration_finished_by_the_other_side(pg: PgDatabases, upstream_pg: str) -> None:
    cairnq = pytest.importorskip("cairnq")
    with pg.connect(upstream_pg) as conn:
        reference = pg_schema(conn)
        reference_ledger = {r["name"] for r in conn.execute("select name from cairnq_migrations")}

    async def upstream_connect(dbname: str) -> None:
        client = cairnq.CairnQ.postgres(pg_url(dbname), min_size=1, max_size=1)
        await client.connect()
        await client.close()

    half = pg.create("half")
    with pg.connect(half) as conn:
        pg_apply(conn, [p for p in migration_files("postgres") if p.name < "0006"], "cairnq")
    asyncio.run(upstream_connect(half))
    with pg.connect(half) as conn:
        assert pg_schema(conn) == reference
        assert {r["name"] for r in conn.execute("select name from cairnq_migrations")} == (
            reference_ledger
        )

    theirs = pg.create("theirs")
    asyncio.run(upstream_connect(theirs))
    with pg.connect(theirs) as conn:
        conn.execute("delete from cairnq_migrations where name >= '0003'")
        conn.commit()
        pg_apply(conn, [p for p in migration_files("postgres") if p.name >= "0003"], "cairnq")
        assert pg_schema(conn) == reference
        assert pg_meta(conn) == [("protocol_version", "1"), ("schema_version", "10")]


def _notify_script(conn: Any) -> None:
    """Transitions that must (or must not) notify, each in its own transaction."""
    now = int(time.time() * 1000)
    cols = "(id, name, queue, status, payload, run_at_ms, created_at_ms, updated_at_ms)"

    def insert(tid: str, queue: str, status: str) -> str:
        values = f"('{tid}', 'n', '{queue}', '{status}', '{{}}', {now}, {now}, {now})"
        return f"insert into cairnq_tasks {cols} values {values}"

    for sql in (
        insert("t1", "q1", "queued"),
        insert("t2", "q2", "running"),
        insert("t3", "q3", "succeeded"),
        "update cairnq_tasks set status = 'running' where id = 't1'",
        "update cairnq_tasks set progress = 0.5 where id = 't1'",
        "update cairnq_tasks set status = 'queued' where id = 't1'",
        "update cairnq_tasks set status = 'queued' where id = 't1'",
        "update cairnq_tasks set status = 'canceled' where id = 't1'",
        "update cairnq_tasks set status = 'failed' where id = 't1'",
        "update cairnq_tasks set status = 'queued' where id = 't1'",
        "update cairnq_tasks set status = 'succeeded' where id = 't2'",
    ):
        conn.execute(sql)


def test_postgres_notify_matches_upstream(pg: PgDatabases, upstream_pg: str) -> None:
    expected = [
        ("cairnq_queued", "q1"),
        ("cairnq_queued", "q1"),
        ("cairnq_done", "t1"),
        ("cairnq_queued", "q1"),
        ("cairnq_done", "t2"),
    ]
    seen = {}
    for name in (pg_ours(pg, "notify"), upstream_pg):
        with pg.connect(name, autocommit=True) as listener, pg.connect(name, autocommit=True) as w:
            listener.execute("listen cairnq_queued")
            listener.execute("listen cairnq_done")
            w.execute("delete from cairnq_tasks where id in ('t1', 't2', 't3')")
            _notify_script(w)
            got = [
                (n.channel, n.payload)
                for n in listener.notifies(timeout=5, stop_after=len(expected))
            ]
            w.execute("delete from cairnq_tasks where id in ('t1', 't2', 't3')")
            seen[name] = got
    assert list(seen.values()) == [expected, expected]
