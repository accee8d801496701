"""A SQLite daemon never loads the Postgres driver: psycopg's import costs each
process ~0.2 s at start (every child, every restart) and memory for good."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cairnqd import CairnQ
from tests.support.daemon import Daemon, base_config
from tests.support.harness import client_call, database_section
from tests.support.waiting import wait_for


def _maps_psycopg(pid: int) -> bool:
    return "psycopg" in Path(f"/proc/{pid}/maps").read_text()


def test_a_sqlite_daemon_and_its_children_never_load_psycopg(
    tmp_path: Path, daemon_factory: Callable[[dict[str, Any]], Daemon]
) -> None:
    db = str(tmp_path / "tasks.db")
    groups = {"default": {"queues": ["default"], "processes": 2}}
    daemon = daemon_factory(base_config(tmp_path, database_section("sqlite", db), groups)).start()

    async def submit(client: CairnQ) -> str:
        return (await client.submit("t.echo", {"x": 1})).id

    task_id = client_call("sqlite", db, submit)

    async def status(client: CairnQ) -> str | None:
        task = await client.get(task_id)
        return None if task is None else task.status

    # Past boot, the first claim and a settlement: whatever these import is loaded.
    wait_for("the task to succeed", lambda: client_call("sqlite", db, status) == "succeeded", 60)
    children = daemon.children()
    assert len(children) == 2
    for pid in (daemon.pid, *children):
        assert not _maps_psycopg(pid), f"pid {pid} loaded psycopg"
