"""The `Executor` contract (cairnqd/store/executor.py): what every dialect gives the code
above it. Each test runs on both dialects; a new dialect passes this file first."""

from __future__ import annotations

import asyncio

import pytest

from cairnqd.models import Task
from cairnqd.store.base import TaskStore
from cairnqd.store.executor import Executor, Row, Session

pytestmark = pytest.mark.asyncio


#: The `list` statement's parameters: the queued tasks, at most 100.
QUEUED: dict[str, object] = {
    "status": "queued",
    "queue": None,
    "name": None,
    "root_id": None,
    "correlation_id": None,
    "limit": 100,
    "offset": 0,
}


async def _queued_ids(db: Executor) -> list[str]:
    rows = await db.fetch("list", QUEUED, frozenset({"status"}))
    return sorted(str(r["id"]) for r in rows)


async def test_the_executor_names_its_dialect(store: TaskStore, dialect: str) -> None:
    assert store.executor.dialect == dialect
    assert store.executor is store.executor  # one per store


async def test_fetch_runs_a_named_statement_and_returns_rows(store: TaskStore) -> None:
    task = await store.submit(name="exec.fetch", payload={"n": 1})
    rows = await store.executor.fetch("get", {"id": task.id})
    assert [r["id"] for r in rows] == [task.id]
    assert rows[0]["status"] == "queued"


async def test_a_transaction_commits_when_its_block_ends(store: TaskStore) -> None:
    db = store.executor
    task = await store.submit(name="exec.commit", payload=None)
    async with db.transaction() as session:
        await session.fetch("cancel", {"id": task.id})
    got = await store.get(task.id)
    assert got is not None and got.status == "canceled"


async def test_a_transaction_rolls_back_when_its_block_raises(store: TaskStore) -> None:
    db = store.executor
    task = await store.submit(name="exec.rollback", payload=None)
    with pytest.raises(RuntimeError, match="undo"):
        async with db.transaction() as session:
            changed = await session.fetch("cancel", {"id": task.id})
            assert changed  # seen inside the transaction ...
            raise RuntimeError("undo")
    got = await store.get(task.id)
    assert got is not None and got.status == "queued"  # ... and gone after it


async def test_transactions_do_not_interleave(store: TaskStore) -> None:
    """Two transactions that each pause then resume a queue: the other never sees the
    pause of one half-done, because a write transaction is isolated."""
    db = store.executor
    seen: list[int] = []

    async def pause_and_resume(queue: str) -> None:
        async with db.transaction() as session:
            made = await session.fetch(
                "extensions/queue_pause", {"queue": queue, "paused_by": "t", "reason": None}
            )
            seen.append(len(made))
            await asyncio.sleep(0.01)
            await session.fetch("extensions/queue_resume", {"queue": queue})

    await asyncio.gather(*(pause_and_resume("exec-q") for _ in range(4)))
    assert seen == [1, 1, 1, 1]  # each found the queue unpaused: none saw another's pause
    assert await store.pauses.all() == []


async def test_scan_converts_the_rows_it_reads(store: TaskStore) -> None:
    db = store.executor
    ids = sorted([(await store.submit(name="exec.scan", payload={"i": i})).id for i in range(5)])

    def just_ids(rows: list[Row]) -> list[str]:
        return [str(r["id"]) for r in rows]

    got = await db.scan("list", QUEUED, frozenset({"status"}), just_ids)
    assert sorted(got) == ids


async def test_replayable_runs_its_work_in_one_transaction(store: TaskStore) -> None:
    db = store.executor
    a = await store.submit(name="exec.replay", payload=None)
    b = await store.submit(name="exec.replay", payload=None)

    async def cancel_both(session: Session) -> list[Row]:
        return [
            *await session.fetch("cancel", {"id": a.id}),
            *await session.fetch("cancel", {"id": b.id}),
        ]

    with db.operation():
        rows = await db.replayable(cancel_both)
    tasks = db.tasks(rows)
    assert all(isinstance(t, Task) for t in tasks)
    assert sorted(t.id for t in tasks) == sorted([a.id, b.id])
    assert {t.status for t in tasks} == {"canceled"}
    assert await _queued_ids(db) == []


async def test_tasks_decodes_json_columns_as_the_driver_returns_them(store: TaskStore) -> None:
    db = store.executor
    task = await store.submit(
        name="exec.json", payload={"nested": [1, {"x": "y"}]}, metadata={"m": True}
    )
    [decoded] = db.tasks(await db.fetch("get", {"id": task.id}))
    assert decoded.payload == {"nested": [1, {"x": "y"}]}
    assert decoded.metadata == {"m": True}
