"""The dashboard's three indexes on cairnq_tasks exist only where a dashboard is served:
a migrated database lacks them (each would cost every insert and status change), the
store builds them on demand, a serving daemon asks for them, and migration
cairnqd_0006 drops those that cairnqd_0004 used to create everywhere.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import psycopg
import pytest

from cairnqd.store.base import TaskStore
from tests.dashboard.conftest import Dash
from tests.support.databases import make_store
from tests.support.waiting import wait_for

INDEXES = {
    "cairnqd_tasks_created_idx",
    "cairnqd_tasks_status_created_idx",
    "cairnqd_tasks_run_at_idx",
}


def present(dialect: str, target: str) -> set[str]:
    """The dashboard's indexes the database holds (valid ones only, on Postgres)."""
    if dialect == "sqlite":
        with closing(sqlite3.connect(target)) as conn:
            listed = conn.execute("select name from sqlite_master where type = 'index'")
            names = {r[0] for r in listed}
    else:
        with psycopg.connect(target) as conn:
            names = {
                r[0]
                for r in conn.execute(
                    "select c.relname from pg_index i join pg_class c on c.oid = i.indexrelid "
                    "where i.indisvalid"
                )
            }
    return names & INDEXES


async def test_a_migrated_database_lacks_them_until_asked(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    assert present(dialect, db_target) == set()
    await store.ensure_schema("dashboard_indexes")
    assert present(dialect, db_target) == INDEXES
    await store.ensure_schema("dashboard_indexes")  # a second start changes nothing
    assert present(dialect, db_target) == INDEXES


async def test_postgres_rebuilds_an_index_a_cancelled_build_left_invalid(
    pg_dsn: str,
) -> None:
    store = make_store("postgres", pg_dsn)
    await store.connect()
    try:
        await store.ensure_schema("dashboard_indexes")
        # What an interrupted `create index concurrently` leaves behind.
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                "update pg_index set indisvalid = false "
                "where indexrelid = 'cairnqd_tasks_run_at_idx'::regclass"
            )
        assert present("postgres", pg_dsn) == INDEXES - {"cairnqd_tasks_run_at_idx"}
        await store.ensure_schema("dashboard_indexes")
        assert present("postgres", pg_dsn) == INDEXES
    finally:
        await store.close()


async def test_migration_0006_drops_what_0004_made(
    dialect: str, db_target: str, tmp_path: Path
) -> None:
    """A database migrated before 0006 has the indexes; migrating it drops them."""
    store = make_store(dialect, db_target)
    await store.connect()
    await store.ensure_schema("dashboard_indexes")  # the state 0004 left
    await store.close()
    forget = "delete from cairnqd_migrations where name like 'cairnqd_0006_%'"
    if dialect == "sqlite":
        with closing(sqlite3.connect(db_target)) as conn, conn:
            conn.execute(forget)
    else:
        with psycopg.connect(db_target, autocommit=True) as conn:
            conn.execute(forget)
    assert present(dialect, db_target) == INDEXES
    again = make_store(dialect, db_target)
    await again.connect()  # applies 0006
    await again.close()
    assert present(dialect, db_target) == set()


@pytest.mark.timeout(180)
def test_a_serving_dashboard_builds_them(dash: Dash) -> None:
    wait_for(
        "the dashboard's indexes",
        lambda: present(dash.dialect, dash.target),
        60,
        accept=lambda found: found == INDEXES,
    )
