"""The command line and task dependencies (docs/workflows.md), on both dialects:
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
        {"id": parent.id, "name": "a", "status": "queued", "waiting": False}
    ]
    assert f"dependents: {child.id} (waiting)" in run("inspect", parent.id).stdout

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
    assert "submit: after names task_nope, which is not a task (never" in refused.stderr


async def _submit_diamond(dialect: str, target: str) -> list[Task]:
    """A -> (B, C) -> D, and a task of no graph; A succeeds, so B and C are due."""
    store = make_store(dialect, target)
    await store.connect()
    try:
        tasks = await store.submit_many(
            [
                {"name": "a"},
                {"name": "b", "after": [0]},
                {"name": "c", "after": [0]},
                {"name": "d", "queue": "merge", "after": [1, 2]},
                {"name": "lone"},
            ]
        )
        claimed = await store.claim(worker_id="w", queues=["default"], names=["a"], limit=1)
        assert [t.id for t in claimed] == [tasks[0].id]
        await store.complete(task_id=tasks[0].id, worker_id="w", result=None)
        return tasks
    finally:
        await store.close()


def test_inspect_tree_and_list_waiting(
    db_config: Path, run: Run, dialect: str, db_target: str
) -> None:
    a, b, c, d, lone = asyncio.run(_submit_diamond(dialect, db_target))
    # The same graph, drawn from its root, whichever task is asked for.
    drawn = run("inspect", c.id, "--tree")
    assert drawn.returncode == 0, drawn.stderr
    lines = drawn.stdout.splitlines()
    assert lines[0] == "graph: 4 tasks: 2 queued, 1 succeeded, 1 waiting"
    assert lines[1] == f"{a.id}  a  [default]  succeeded"
    assert lines[2] == f"├── {b.id}  b  [default]  queued"
    assert lines[3] == f"│   └── {d.id}  d  [merge]  waiting  (after 2)"
    assert lines[4] == f"└── {c.id}  c  [default]  queued  <- this task"
    assert lines[5] == f"    └── {d.id}  d  waiting  (above)"
    assert len(lines) == 6
    graph = json.loads(run("inspect", d.id, "--tree", "--json").stdout)
    assert [t["id"] for t in graph["tasks"]] == [a.id, b.id, c.id, d.id]
    assert graph["tasks"][3]["after"] == [b.id, c.id] and graph["tasks"][3]["waiting"]
    assert not graph["truncated"]
    # A task of no graph is a graph of one.
    assert run("inspect", lone.id, "--tree").stdout.splitlines()[0] == ("graph: 1 tasks: 1 queued")

    waiting = run("list", "--waiting")
    assert waiting.returncode == 0, waiting.stderr
    rows = waiting.stdout.splitlines()
    assert len(rows) == 2 and rows[1].split()[0] == d.id
    assert run("list", "--waiting", "--queue", "default").stdout.strip().endswith("(no tasks)")
    listed = json.loads(run("list", "--waiting", "--json").stdout)
    assert [t["id"] for t in listed] == [d.id]
    both = run("list", "--waiting", "--status", "queued")
    assert both.returncode == 64 and "not allowed with argument" in both.stderr
