"""Task dependencies with real workers (docs/workflows.md), on both dialects: a
map -> reduce graph submitted from a handler, the public `cairnq` 0.15.1 worker settling
a parent (the dependent is due within a second, with no step of ours in between), and
that worker never taking a task that still waits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import cairnq
import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.store.base import TaskStore
from cairnqd.store.dependencies import WAITING_RUN_AT, is_waiting
from cairnqd.worker import Worker
from tests.support.store import upstream_client
from tests.support.waiting import wait_for_async
from tests.support.worker import running

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def theirs(store: TaskStore, dialect: str, db_target: str) -> AsyncIterator[cairnq.CairnQ]:
    """A public-SDK handle on the same database (after ours has migrated it)."""
    async with upstream_client(dialect, db_target) as client:
        yield client


def _their_worker(store: Any) -> cairnq.Worker:
    worker = cairnq.Worker(store, ["default"], poll_interval_ms=50, concurrency=2)

    @worker.task("theirs.square")
    async def square(ctx: Any, payload: Any) -> int:
        return int(payload["n"]) ** 2

    return worker


async def _finished(client: CairnQ, task_id: str) -> Any:
    async def done() -> Any:
        row = await client.get(task_id)
        return row if row is not None and row.is_terminal else None

    return await wait_for_async(f"{task_id} to finish", done)


async def test_map_reduce_from_a_handler(store: TaskStore, client: CairnQ) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50, concurrency=4)

    @worker.task("split")
    async def split(ctx: TaskContext, payload: Any) -> str:
        parts = [await ctx.submit("map", {"n": n}) for n in payload["numbers"]]
        reducer = await ctx.submit("reduce", after=parts)
        return reducer.id

    @worker.task("map")
    async def map_(ctx: TaskContext, payload: Any) -> int:
        return int(payload["n"]) * 10

    @worker.task("reduce")
    async def reduce(ctx: TaskContext) -> list[Any]:
        return [parent.result for parent in await ctx.dependencies()]

    async with running(worker):
        top = await client.submit("split", {"numbers": [3, 1, 2]})
        done = await _finished(client, top.id)
        assert done.status == "succeeded"
        reduced = await _finished(client, done.result)
    assert (reduced.status, reduced.result) == ("succeeded", [30, 10, 20])
    assert reduced.root_id == top.root_id


@pytest.mark.timing
async def test_their_worker_settles_a_parent_and_the_dependent_is_due_within_a_second(
    client: CairnQ, theirs: cairnq.CairnQ
) -> None:
    parent = await client.submit("theirs.square", {"n": 7})
    dependent = await client.submit("ours.sum", after=[parent])
    assert is_waiting(dependent)
    async with _their_worker(theirs.store).background():
        settled = await _finished(client, parent.id)
    assert settled.status == "succeeded" and settled.result == 49
    now = await client.get(dependent.id)
    assert now is not None and now.status == "queued"
    assert settled.completed_at_ms is not None
    assert now.run_at_ms <= settled.completed_at_ms + 1_000, "due within 1 s of the settle"
    # And it is claimable at once: any worker's claim takes it.
    [claimed] = await client.store.claim(queues=["default"], worker_id="w1", limit=5)
    assert claimed.id == dependent.id


async def test_their_worker_never_claims_a_waiting_task(
    client: CairnQ, theirs: cairnq.CairnQ
) -> None:
    blocker = await client.submit("nobody.runs.this")
    waiting = await client.submit("theirs.square", {"n": 2}, after=[blocker])
    free = await client.submit("theirs.square", {"n": 3})
    async with _their_worker(theirs.store).background():
        # Their worker has drawn past the waiting task: a later, free one is done.
        done = await _finished(client, free.id)
        assert done.result == 9
        row = await theirs.get(waiting.id)
        assert row is not None
        assert (row.status, row.attempt, row.run_at_ms) == ("queued", 0, WAITING_RUN_AT)
        # Canceling the blocker cancels the dependent, and their SDK reads the envelope.
        await client.cancel(blocker.id)
        row = await theirs.get(waiting.id)
        assert row is not None and row.status == "canceled"
        assert row.error is not None and row.error["code"] == "dependency_failed"
