"""A cancel request stops a running handler in a bare `Worker`, whether or not it looks.

The worker reads the cancel flags of its running tasks about once a second; a handler
that has not returned `cancel_grace` later is cancelled (async), and its task ends
`canceled` as a cooperative cancel does. One that does not stop (a sync handler's
thread, an async one that swallows the cancellation) keeps its task held and renewed
until it returns: no other execution can start beside it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.worker import eventually, running, wait_status, wrap_method

GRACE_S = 0.5


def _worker(store: TaskStore, **kw: Any) -> Worker:
    # A long lease: the renewals (every lease/3) cannot be what notices the cancel.
    return Worker(store, poll_interval_ms=20, lease_ms=60_000, cancel_grace=GRACE_S, **kw)


async def _until_running(store: TaskStore, task_id: str) -> None:
    await wait_status(store, task_id, "running")


@pytest.mark.timing
@pytest.mark.parametrize("max_run_ms", [None, 600_000], ids=["direct", "max_run"])
async def test_an_async_handler_that_ignores_the_cancel_is_cancelled_after_the_grace(
    store: TaskStore, client: CairnQ, max_run_ms: int | None
) -> None:
    worker = _worker(store, max_run_ms=max_run_ms)
    started = asyncio.Event()
    cancelled_at: list[float] = []

    @worker.task("stubborn")
    async def stubborn(ctx: Any, payload: Any) -> str:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled_at.append(time.monotonic())
            raise
        return "never"

    task = await client.submit("stubborn", {}, max_attempts=3)
    async with running(worker):
        await eventually(started.is_set)
        asked = time.monotonic()
        await client.cancel(task.id)
        done = await wait_status(store, task.id, within=GRACE_S + 10)
        ended = time.monotonic()
    assert done.status == "canceled", done
    # The same outcome as a handler that returns on ctx.canceled(): no error, no retry.
    assert done.error is None
    assert done.attempt == 1
    assert len(cancelled_at) == 1
    # Not before the grace; at most a poll (1 s) and the grace later, with slack.
    assert cancelled_at[0] - asked >= GRACE_S
    assert ended - asked < GRACE_S + 2.5
    assert len(worker.in_flight) == 0


async def test_a_cooperative_handler_ends_before_the_grace(
    store: TaskStore, client: CairnQ
) -> None:
    worker = Worker(store, poll_interval_ms=20, lease_ms=60_000, cancel_grace=3600)
    interrupted: list[bool] = []

    @worker.task("polite")
    async def polite(ctx: TaskContext, payload: Any) -> str:
        try:
            while True:  # a handler that checks between steps of its work
                if await ctx.canceled():
                    break
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            interrupted.append(True)
            raise
        return "stopped early"

    task = await client.submit("polite", {})
    async with running(worker):
        await _until_running(store, task.id)
        await client.cancel(task.id)
        done = await wait_status(store, task.id, within=20)
    assert done.status == "canceled"
    assert done.error is None
    assert interrupted == []


async def test_the_watch_marks_cancels_for_handlers_that_only_read_the_flag(
    store: TaskStore, client: CairnQ
) -> None:
    """ctx.canceled() is answered without a read once the watch saw the flag."""
    worker = Worker(store, poll_interval_ms=20, lease_ms=60_000, cancel_grace=3600)
    seen = asyncio.Event()

    @worker.task("looks")
    async def looks(ctx: TaskContext, payload: Any) -> None:
        while True:
            if ctx.cancel_seen:
                break
            await asyncio.sleep(0.02)
        seen.set()

    task = await client.submit("looks", {})
    async with running(worker):
        await _until_running(store, task.id)
        await client.cancel(task.id)
        await eventually(seen.is_set, within=10)
        done = await wait_status(store, task.id)
    assert done.status == "canceled"


async def test_a_handlers_own_cancelled_error_still_fails_its_attempt(
    store: TaskStore, client: CairnQ
) -> None:
    """Without a cancel request, a CancelledError the handler raises is its failure."""
    worker = _worker(store, retry_backoff_ms=0)

    @worker.task("own")
    async def own(ctx: Any, payload: Any) -> None:
        shared: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        shared.cancel()
        await shared

    task = await client.submit("own", {}, max_attempts=1)
    async with running(worker):
        done = await wait_status(store, task.id)
    assert done.status == "failed"
    assert done.error["code"] == "handler_error"


async def test_nothing_is_read_while_no_handler_runs(store: TaskStore, client: CairnQ) -> None:
    worker = Worker(store, poll_interval_ms=20, cancel_grace=0.2)
    reads: list[int] = []

    async def counted(original: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(len(kwargs["task_ids"]))
        return await original(*args, **kwargs)

    wrap_method(store, "cancel_requests", counted)
    release = asyncio.Event()

    @worker.task("waits")
    async def waits(ctx: Any, payload: Any) -> None:
        await release.wait()

    async with running(worker):
        task = await client.submit("waits", {})
        await eventually(lambda: len(reads) >= 2, within=10)
        assert set(reads) == {1}  # one id per read: the running task's
        release.set()
        await wait_status(store, task.id)
        counted_after = len(reads)
        # Idle for several watch ticks (0.05 s each): no read.
        for _ in range(10):
            await asyncio.sleep(0.05)
            assert worker.handled == 1
        assert len(reads) <= counted_after + 1  # at most a read already under way


@pytest.mark.timing
async def test_a_sync_handler_that_does_not_stop_keeps_its_task_until_it_returns(
    store: TaskStore, client: CairnQ
) -> None:
    worker = _worker(store)
    release = threading.Event()
    started = threading.Event()
    overruns: list[list[str]] = []

    def on_overrun(contexts: Sequence[TaskContext]) -> None:
        overruns.append([c.task_id for c in contexts])

    worker.on_cancel_overrun = on_overrun

    @worker.task("blocking")
    def blocking(ctx: Any, payload: Any) -> str:
        started.set()
        release.wait(60)
        return "late"

    task = await client.submit("blocking", {})
    async with running(worker):
        await eventually(started.is_set)
        await client.cancel(task.id)
        await eventually(lambda: bool(overruns), within=2 * GRACE_S + 10)
        assert overruns == [[task.id]]
        # The thread still runs: the task stays running under this worker, renewed.
        row = await store.get(task.id)
        assert row is not None and row.status == "running"
        assert row.worker_id == worker.worker_id
        release.set()
        done = await wait_status(store, task.id)
    assert done.status == "canceled"
    assert done.result is None


@pytest.mark.timing
async def test_an_async_handler_that_swallows_the_cancel_keeps_its_task(
    store: TaskStore, client: CairnQ
) -> None:
    worker = _worker(store)
    release = asyncio.Event()
    swallowed = asyncio.Event()
    overruns: list[list[str]] = []
    worker.on_cancel_overrun = lambda contexts: overruns.append([c.task_id for c in contexts])

    @worker.task("swallows")
    async def swallows(ctx: Any, payload: Any) -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.set()
        await release.wait()
        return "ignored"

    task = await client.submit("swallows", {})
    async with running(worker):
        await _until_running(store, task.id)
        await client.cancel(task.id)
        await eventually(swallowed.is_set, within=GRACE_S + 10)
        await eventually(lambda: bool(overruns), within=GRACE_S + 10)
        row = await store.get(task.id)
        assert row is not None and row.status == "running"
        release.set()
        done = await wait_status(store, task.id)
    assert done.status == "canceled"
    assert done.result is None


def test_cancel_grace_is_checked() -> None:
    with pytest.raises(ValueError, match="cancel_grace"):
        Worker.sqlite(":memory:", cancel_grace=-1)
