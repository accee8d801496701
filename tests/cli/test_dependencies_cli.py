"""The command line and task dependencies (docs/dependencies.md), on both dialects:
`stats` counts the tasks waiting on their parents apart, and `cancel`/`retry` of a
parent cancel and bring back what waits on it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from cairnqd.models import Task
from cairnqd.store.dependencies import is_waiting
from tests.support.cli import Run
from tests.support.databases import make_store


async def _submit_chain(dialect: str, target: str) -> tuple[Task, Task]:
    store = make_store(dialect, target)
    await store.connect()
    try:
        parent = await store.submit(name="a", queue="mail")
        child = await store.submit(name="b", queue="mail", after=[parent])
        return parent, child
    finally:
        await store.close()


async def _get(dialect: str, target: str, task_id: str) -> Task:
    store = make_store(dialect, target)
    await store.connect()
    try:
        task = await store.get(task_id)
        assert task is not None
        return task
    finally:
        await store.close()


def test_stats_cancel_and_retry_with_a_waiting_task(
    db_config: Path, run: Run, dialect: str, db_target: str
) -> None:
    parent, child = asyncio.run(_submit_chain(dialect, db_target))
    stats = json.loads(run("stats", "--json").stdout)
    assert stats["mail"]["queued"] == 2 and stats["mail"]["waiting"] == 1
    lines = run("stats").stdout.splitlines()
    assert lines[0].split() == [
        "QUEUE", "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELED", "WAITING", "TOTAL"
    ]  # fmt: skip
    assert lines[1].split() == ["mail", "2", "0", "0", "0", "0", "1", "2"]
    assert lines[-2].startswith("WAITING counts the QUEUED tasks held")

    # A waiting task's run_at is past any date: shown as what it waits for.
    listed = run("list", "--queue", "mail")
    assert listed.returncode == 0 and "after-deps" in listed.stdout
    shown = run("inspect", child.id)
    assert shown.returncode == 0
    assert "run_at_ms: 253402214400000 (when its dependencies have succeeded)" in shown.stdout
    assert f"after: {parent.id} (queued)" in shown.stdout
    assert json.loads(run("inspect", child.id, "--json").stdout)["after"] == [
        {"id": parent.id, "status": "queued"}
    ]

    assert run("cancel", parent.id).returncode == 0
    canceled = asyncio.run(_get(dialect, db_target, child.id))
    assert canceled.status == "canceled" and canceled.error is not None
    assert canceled.error["code"] == "dependency_failed" and parent.id in canceled.error["message"]
    assert json.loads(run("stats", "--json").stdout)["mail"]["waiting"] == 0

    assert run("retry", parent.id).returncode == 0
    assert is_waiting(asyncio.run(_get(dialect, db_target, child.id)))


def test_submit_after(db_config: Path, run: Run, dialect: str, db_target: str) -> None:
    parent = run("submit", "demo.echo").stdout.strip()
    child = run("submit", "demo.echo", "--after", parent, "--after", parent).stdout.strip()
    assert child.startswith("task_") and child != parent
    assert is_waiting(asyncio.run(_get(dialect, db_target, child)))
    refused = run("submit", "demo.echo", "--after", "task_nope")
    assert refused.returncode == 65
    assert "submit: after names task_nope, which is not a task" in refused.stderr
