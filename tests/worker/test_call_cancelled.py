"""A handler call whose own task is cancelled (not by the worker) lets its task go.

A cancellation of the call's task that the worker did not ask for (neither the lease
guard nor the cancel watch) is taken for one from outside the worker, such as the event
loop shutting down: the task is left to its lease, not failed. A handler can do it too
(`asyncio.current_task().cancel()` from a watcher it started, to stop itself when
`ctx.canceled()` says so). The worker then went on renewing that task's lease for as
long as it lived: the task stayed `running` with nothing running it, never recovered.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.worker import ErrorLog, eventually, running, wait_status

pytestmark = pytest.mark.timeout(120)

LEASE_MS = 1000


@pytest.mark.parametrize("batch", [None, 2])
async def test_a_call_cancelled_from_its_own_side_leaves_the_task_to_its_lease(
    store: TaskStore, client: CairnQ, batch: int | None
) -> None:
    worker = Worker(store, lease_ms=LEASE_MS, poll_interval_ms=50, on_error=ErrorLog())
    attempts: list[int] = []

    async def cancel_me() -> None:
        me = asyncio.current_task()
        assert me is not None
        watcher = asyncio.get_running_loop().call_soon(me.cancel)
        try:
            await asyncio.sleep(60)
        finally:
            watcher.cancel()

    if batch is None:

        @worker.task("selfcancel")
        async def single(ctx: TaskContext, payload: Any) -> str:
            attempts.append(ctx.attempt)
            if ctx.attempt == 1:
                await cancel_me()
            return "second"

    else:

        @worker.task("selfcancel", batch=batch)
        async def batched(items: list[TaskContext]) -> None:
            attempts.extend(ctx.attempt for ctx in items)
            if items[0].attempt == 1:
                await cancel_me()

    task = await client.submit("selfcancel", {}, max_attempts=3)
    async with running(worker):
        await eventually(lambda: attempts, what="the first call")
        # Let go at once: no longer held, so no longer renewed.
        await eventually(lambda: len(worker.in_flight) == 0, what="the task let go")
        done = await wait_status(store, task.id, within=30)
    assert done.status == "succeeded", done
    assert done.attempt == 2
    assert attempts == [1, 2]
