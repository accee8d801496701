"""`submit(tx=...)` against the real daemon: a task written in the application's own
transaction is run by the daemon's children once that transaction commits, and a
rolled-back one never exists for them."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cairnqd import CairnQ
from tests.support.daemon import base_config
from tests.support.harness import client_call, database_section
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def test_the_daemon_runs_a_committed_task_and_never_sees_a_rolled_back_one(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    config = base_config(
        tmp_path, database_section(dialect, db_target), {"g": {"queues": ["q"], "processes": 1}}
    )
    config["handlers"] = ["tests.daemon.fault_handlers:registry"]
    daemon_factory(config).start()
    client = CairnQ.sqlite(db_target) if dialect == "sqlite" else CairnQ.postgres(db_target)
    conn: Any = sqlite3.connect(db_target) if dialect == "sqlite" else psycopg.connect(db_target)
    try:
        conn.execute("create table orders (id integer primary key)")
        conn.commit()
        conn.execute("insert into orders (id) values (1)")
        dropped = client.submit_sync("f.quick", {}, queue="q", key="order-1", tx=conn)
        conn.rollback()
        conn.execute("insert into orders (id) values (2)")
        kept = client.submit_sync("f.quick", {}, queue="q", key="order-2", tx=conn)
        conn.commit()
    finally:
        conn.close()

    def status(task_id: str) -> Any:
        task = client_call(dialect, db_target, lambda c: c.get(task_id))
        return None if task is None else task.status

    wait_for("the committed task to run", lambda: status(kept.id) == "succeeded", timeout=60)
    assert status(dropped.id) is None
    assert client_call(dialect, db_target, lambda c: c.get_by_key("order-1")) is None
