"""docs/protocol.md §8.8: `ctx.submit` wires parent, root and correlation ids; `ctx.wait` waits."""

from __future__ import annotations

from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.models import TaskDef
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.worker import running, wait_status

pytestmark = pytest.mark.timeout(60)


async def test_child_tasks_are_wired_and_waited(store: TaskStore, client: CairnQ) -> None:
    worker = Worker(store, ["default", "side"], poll_interval_ms=20, concurrency=4)
    leaf_def: TaskDef[dict[str, Any], int] = TaskDef("leaf")
    seen: dict[str, Any] = {}

    @worker.task
    async def parent(ctx: TaskContext, payload: Any) -> dict[str, Any]:
        child = await ctx.submit("middle", {"n": payload["n"]}, queue="side", priority=5)
        seen["child_submitted"] = child
        finished = await ctx.wait(child.id, timeout_ms=20_000)
        return {"child": finished.result, "child_status": finished.status}

    @worker.task
    async def middle(ctx: TaskContext, payload: Any) -> int:
        seen["middle_ctx"] = (ctx.root_id, ctx.correlation_id, ctx.queue)
        grandchild = await ctx.submit(leaf_def, {"n": payload["n"]})
        done = await ctx.wait(grandchild.id, timeout_ms=20_000, poll_ms=10)
        return int(done.result) + 1

    @worker.task
    async def leaf(ctx: TaskContext, payload: Any) -> int:
        return int(payload["n"]) * 10

    top = await store.submit(name="parent", payload={"n": 4}, correlation_id="req-42")
    async with running(worker):
        done = await wait_status(store, top.id)
    assert (done.status, done.result) == ("succeeded", {"child": 41, "child_status": "succeeded"})

    child = seen["child_submitted"]
    assert child.parent_id == top.id
    assert child.root_id == top.id == top.root_id
    assert child.correlation_id == "req-42"
    assert (child.queue, child.priority) == ("side", 5)
    assert seen["middle_ctx"] == (top.id, "req-42", "side")

    family = await client.list(root_id=top.id)
    by_name = {t.name: t for t in family}
    assert set(by_name) == {"parent", "middle", "leaf"}
    assert by_name["leaf"].parent_id == child.id
    assert by_name["leaf"].root_id == top.id
    assert by_name["leaf"].correlation_id == "req-42"
    assert [t.name for t in await client.list(correlation_id="req-42")].count("leaf") == 1


async def test_submit_after_settling_is_allowed(store: TaskStore, client: CairnQ) -> None:
    """Settled is no bar to fanning out (only a lost lease is)."""
    worker = Worker(store, ["default"], poll_interval_ms=20)

    @worker.task
    async def fan(ctx: TaskContext) -> None:
        await ctx.succeed("first")
        await ctx.submit("after", {"from": ctx.task_id})

    top = await client.submit("fan")
    async with running(worker):
        await wait_status(store, top.id)
    children = await client.list(name="after")
    assert len(children) == 1 and children[0].parent_id == top.id
