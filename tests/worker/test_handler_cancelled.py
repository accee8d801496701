"""A handler's own `asyncio.CancelledError` is the handler's failure, not a shutdown.

A handler that awaits a future somebody else cancelled (a shared request, a
`gather` whose sibling was cancelled) sees `CancelledError` although nobody cancelled
the handler. The worker must fail that attempt like any other error: before, it took
the error for its own shutdown, left the context held and the task `running`, renewed
its lease forever, and a drain left it `running`.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.worker import SQLITE_ONLY, running, wait_status

pytestmark = SQLITE_ONLY


async def _cancelled_elsewhere() -> None:
    """Await a future that some other code cancelled."""
    shared: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    shared.cancel()
    await shared


@pytest.mark.parametrize("max_run_ms", [None, 60_000], ids=["direct", "max_run"])
async def test_a_handler_raising_cancelled_error_fails_its_attempt(
    store: TaskStore, client: CairnQ, max_run_ms: int | None
) -> None:
    worker = Worker(store, poll_interval_ms=20, max_run_ms=max_run_ms, retry_backoff_ms=0)
    calls = 0

    @worker.task("job")
    async def job(ctx: Any, payload: Any) -> str:
        nonlocal calls
        calls += 1
        if ctx.attempt == 1:
            await _cancelled_elsewhere()
        return "second time lucky"

    once = await client.submit("job", {}, max_attempts=1)
    twice = await client.submit("job", {}, max_attempts=2)
    async with running(worker):
        failed = await wait_status(store, once.id)
        retried = await wait_status(store, twice.id)
    assert failed.status == "failed"
    assert failed.error["type"] == "CancelledError"
    assert failed.error["code"] == "handler_error"
    assert retried.status == "succeeded", retried
    assert retried.attempt == 2
    # Nothing is left held, so nothing is heartbeated any more.
    assert len(worker.in_flight) == 0


async def test_a_sync_handler_raising_cancelled_error_fails_its_attempt(
    store: TaskStore, client: CairnQ
) -> None:
    worker = Worker(store, poll_interval_ms=20)
    ran_in: list[str] = []

    @worker.task("job")
    def job(ctx: Any, payload: Any) -> None:
        ran_in.append(threading.current_thread().name)
        raise asyncio.CancelledError("the thread's own")

    task = await client.submit("job", {}, max_attempts=1)
    async with running(worker):
        done = await wait_status(store, task.id)
    assert ran_in and ran_in[0].startswith("cairnqd-sync")
    assert done.status == "failed"
    assert done.error["type"] == "CancelledError"
    assert len(worker.in_flight) == 0


async def test_stopping_the_worker_still_drains_past_a_handler_cancelled_error(
    store: TaskStore, client: CairnQ
) -> None:
    # The drain must not hang or leave the task running: stop() while the handler is
    # in flight, then the handler raises its own CancelledError.
    worker = Worker(store, poll_interval_ms=20)
    started = asyncio.Event()
    go_on = asyncio.Event()

    @worker.task("job")
    async def job(ctx: Any, payload: Any) -> None:
        started.set()
        await go_on.wait()
        await _cancelled_elsewhere()

    task = await client.submit("job", {}, max_attempts=1)
    async with running(worker):
        await asyncio.wait_for(started.wait(), 20)
        worker.stop()
        go_on.set()
    done = await store.get(task.id)
    assert done is not None
    assert done.status == "failed", done
    assert done.error["type"] == "CancelledError"
