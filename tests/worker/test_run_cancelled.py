"""`Worker.run()` cancelled while it drains ends everything it started.

`stop()` drains: `run()` returns once the calls in flight have finished. A caller that
will not wait that long cancels `run()` (`asyncio.wait_for(run_task, 5)` after `stop()`
does it at the timeout). The cancellation ended the drain and skipped the rest of
`run()`: its heartbeat, lease guard, cancel watch and count flusher, and the handler
calls, ran on for the life of the event loop, the heartbeat renewing the lease of a
task whose worker had returned, so that no other worker could ever take it over.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.worker import ErrorLog, eventually, wait_status

pytestmark = pytest.mark.timeout(120)

LEASE_MS = 1000
#: What `Worker.run()` starts beside the claim loop, and the handler calls.
WORKER_PARTS = {
    "heartbeat_loop",
    "LeaseGuard.run",
    "CancelWatch.run",
    "CountFlusher.run",
    "CallRunner.execute",
}


def _worker_parts() -> list[str]:
    running = []
    for task in asyncio.all_tasks():
        name = getattr(task.get_coro(), "__qualname__", "")
        if name in WORKER_PARTS and not task.done():
            running.append(name)
    return sorted(running)


async def test_cancelling_run_while_it_drains_ends_its_parts_and_lets_the_task_go(
    store: TaskStore, client: CairnQ
) -> None:
    worker = Worker(store, lease_ms=LEASE_MS, poll_interval_ms=50, on_error=ErrorLog())
    started = asyncio.Event()
    calls: list[int] = []

    @worker.task("slow")
    async def slow(ctx: TaskContext, payload: Any) -> str:
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            started.set()
            await asyncio.sleep(600)
        return "done"

    task = await client.submit("slow", {}, max_attempts=3)
    runner = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(started.wait(), 20)
        worker.stop()
        # The drain waits for the handler; the caller gives up on it.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(runner, 0.5)
        assert runner.cancelled()
        await eventually(lambda: _worker_parts() == [], what="the worker's parts to end")
        assert len(worker.in_flight) == 0
    finally:
        runner.cancel()
        with contextlib.suppress(BaseException):
            await runner
    # Not renewed any more: once its lease ends another run of the worker recovers it.
    async with asyncio.timeout(60):
        second = asyncio.create_task(worker.run())
        try:
            done = await wait_status(store, task.id, within=30)
        finally:
            worker.stop()
            await second
    assert (done.status, done.attempt, done.result) == ("succeeded", 2, "done"), done
    assert calls == [1, 2]
