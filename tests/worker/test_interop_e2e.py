"""End to end across SDKs (docs/protocol.md §9.4, §8): the public `cairnq` 0.15.1 client calls
tasks our Worker runs, and our client calls tasks their `cairnq.Worker` runs, on one
SQLite file or one Postgres database. Both workers run in this event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import cairnq
import pytest

from cairnqd.client import CairnQ, outcome
from cairnqd.context import TaskContext
from cairnqd.errors import TaskCanceled, TaskError, TaskFailed
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.store import upstream_client
from tests.support.waiting import wait_for_async
from tests.support.worker import running

pytestmark = pytest.mark.timeout(90)

PAYLOAD = {"text": "naïve café ✓", "n": 6, "list": [1, 2.5, None, True, {"k": "v"}]}


@pytest.fixture
async def theirs(store: TaskStore, dialect: str, db_target: str) -> AsyncIterator[cairnq.CairnQ]:
    """A public-SDK handle on the same database (after ours has migrated it)."""
    async with upstream_client(dialect, db_target) as client:
        yield client


def our_worker(store: TaskStore) -> Worker:
    worker = Worker(store, ["default"], poll_interval_ms=50, concurrency=4, retry_backoff_ms=10)

    @worker.task("ours.echo")
    async def echo(ctx: TaskContext, payload: Any) -> dict[str, Any]:
        return {"payload": payload, "attempt": ctx.attempt, "by": "cairnqd"}

    @worker.task("ours.reject")
    async def reject(ctx: TaskContext, payload: Any) -> None:
        raise TaskError("invalid order", code="bad_order", details={"order": payload["id"]})

    @worker.task("ours.flaky")
    def flaky(ctx: TaskContext) -> str:  # sync, in a thread
        if ctx.attempt < 2:
            raise ConnectionError("transient")
        return f"ok on {ctx.attempt}"

    @worker.task("ours.batch", batch=8)
    async def batch(items: list[TaskContext]) -> dict[str, Any]:
        return {c.task_id: c.payload["n"] ** 2 for c in items}

    @worker.task("ours.parent")
    async def parent(ctx: TaskContext, payload: Any) -> dict[str, Any]:
        child = await ctx.submit("theirs.child", {"n": payload["n"]})
        done = await ctx.wait(child.id, timeout_ms=30_000)
        return {"child_id": child.id, "child_result": done.result}

    return worker


def their_worker(store: Any) -> cairnq.Worker:
    worker = cairnq.Worker(
        store, ["default"], poll_interval_ms=50, concurrency=4, retry_backoff_ms=10
    )

    @worker.task("theirs.echo")
    async def echo(ctx: Any, payload: Any) -> dict[str, Any]:
        return {"payload": payload, "attempt": ctx.attempt, "by": "cairnq"}

    @worker.task("theirs.reject")
    async def reject(ctx: Any, payload: Any) -> None:
        raise cairnq.TaskError("invalid order", code="bad_order", details={"order": payload["id"]})

    @worker.task("theirs.child")
    async def child(ctx: Any, payload: Any) -> int:
        return int(payload["n"]) * 100

    @worker.task("theirs.wait_cancel")
    async def wait_cancel(ctx: Any) -> str:
        while not await ctx.canceled():  # noqa: ASYNC110 - the cooperative check
            await asyncio.sleep(0.02)
        return "saw cancel"

    return worker


async def test_their_client_calls_our_worker(store: TaskStore, theirs: cairnq.CairnQ) -> None:
    worker = our_worker(store)
    async with running(worker):
        result = await theirs.call("ours.echo", PAYLOAD, timeout_ms=30_000)
        assert result == {"payload": PAYLOAD, "attempt": 1, "by": "cairnqd"}

        with pytest.raises(cairnq.TaskFailed) as failed:
            await theirs.call("ours.reject", {"id": 7}, timeout_ms=30_000)
        assert (failed.value.code, failed.value.type, failed.value.retryable) == (
            "bad_order",
            "TaskError",
            False,
        )
        assert failed.value.details == {"order": 7}

        assert await theirs.call("ours.flaky", timeout_ms=30_000) == "ok on 2"

        submitted = [await theirs.submit("ours.batch", {"n": n}) for n in range(5)]
        results = [(await theirs.wait(t.id, timeout_ms=30_000)).result for t in submitted]
        assert results == [n * n for n in range(5)]

        row = await theirs.get(submitted[0].id)
        assert row is not None and row.worker_id == worker.worker_id


async def test_our_client_calls_their_worker(
    store: TaskStore, client: CairnQ, theirs: cairnq.CairnQ
) -> None:
    worker = their_worker(theirs.store)
    async with worker.background():
        result = await client.call("theirs.echo", PAYLOAD, timeout_ms=30_000)
        assert result == {"payload": PAYLOAD, "attempt": 1, "by": "cairnq"}

        with pytest.raises(TaskFailed) as failed:
            await client.call("theirs.reject", {"id": 9}, timeout_ms=30_000)
        assert (failed.value.code, failed.value.type, failed.value.retryable) == (
            "bad_order",
            "TaskError",
            False,
        )
        assert failed.value.details == {"order": 9}

        task = await client.submit("theirs.wait_cancel")

        async def running_there() -> bool:
            row = await client.get(task.id)
            return row is not None and row.status == "running"

        await wait_for_async("their worker to start the task", running_there)
        await client.cancel(task.id)
        done = await client.wait(task.id, timeout_ms=30_000)
        assert (done.status, done.result) == ("canceled", None)
        with pytest.raises(TaskCanceled):
            outcome(done)


async def test_mixed_fleet_parent_and_child_across_sdks(
    store: TaskStore, client: CairnQ, theirs: cairnq.CairnQ
) -> None:
    """Their client calls our parent task, which fans out a child that their worker
    runs; both workers share the queue and never take each other's names."""
    ours = our_worker(store)
    foreign = their_worker(theirs.store)
    async with running(ours), foreign.background():
        result = await theirs.call("ours.parent", {"n": 3}, timeout_ms=30_000)
        assert result["child_result"] == 300
        child = await theirs.get(result["child_id"])
        assert child is not None
        assert child.status == "succeeded"
        assert child.worker_id == foreign.worker_id
        assert child.parent_id is not None
        parent = await client.get(child.parent_id)
        assert parent is not None and parent.worker_id == ours.worker_id
        assert child.root_id == parent.id

        # Both fleets at once, many tasks: every task ends with the worker that has it.
        ids_ours = [(await theirs.submit("ours.echo", {"i": i})).id for i in range(10)]
        ids_theirs = [(await client.submit("theirs.echo", {"i": i})).id for i in range(10)]
        for task_id in ids_ours:
            done = await client.wait(task_id, timeout_ms=30_000)
            assert (done.status, done.worker_id) == ("succeeded", ours.worker_id)
        for task_id in ids_theirs:
            done_theirs = await theirs.wait(task_id, timeout_ms=30_000)
            assert (done_theirs.status, done_theirs.worker_id) == (
                "succeeded",
                foreign.worker_id,
            )
