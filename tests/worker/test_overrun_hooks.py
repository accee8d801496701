"""An `on_lease_overrun` or `on_cancel_overrun` hook that raises does not end the watch
that called it.

Both hooks are the application's code, called from the lease guard and the cancel watch
as they look over every running call. A hook that raised (an alert that could not be
sent) ended that look and the task running it, silently: from then on no handler whose
lease could not be renewed was stopped (two executions of one task could overlap),
and no canceled handler was stopped after its grace.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.locks import database_locked_async
from tests.support.worker import ErrorLog, eventually, running, wait_status

pytestmark = pytest.mark.timeout(180)

GRACE_S = 0.3
LEASE_MS = 2000
HELD_S = 4.5  # longer than the lease


class RaisingHook:
    """Records each call, then raises."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, contexts: Sequence[TaskContext]) -> None:
        self.calls.append([c.task_id for c in contexts])
        raise RuntimeError("the alert could not be sent")


async def test_a_raising_cancel_overrun_hook_leaves_the_cancel_watch_running(
    store: TaskStore, client: CairnQ
) -> None:
    worker = Worker(
        store, concurrency=2, poll_interval_ms=20, lease_ms=60_000, cancel_grace=GRACE_S
    )
    hook = worker.on_cancel_overrun = RaisingHook()
    release = threading.Event()
    started = threading.Event()
    stopped: list[str] = []

    @worker.task("blocking")
    def blocking(ctx: TaskContext, payload: Any) -> str:
        started.set()
        release.wait(60)
        return "late"

    @worker.task("stubborn")
    async def stubborn(ctx: TaskContext, payload: Any) -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.append(ctx.task_id)
            raise
        return "never"

    first = await client.submit("blocking", {})
    async with running(worker):
        try:
            await eventually(started.is_set)
            await client.cancel(first.id)
            await eventually(lambda: hook.calls, within=2 * GRACE_S + 10)
            # The watch goes on: the next canceled handler is still stopped.
            second = await client.submit("stubborn", {})
            await wait_status(store, second.id, "running")
            await client.cancel(second.id)
            done = await wait_status(store, second.id, within=GRACE_S + 10)
        finally:
            release.set()
        assert done.status == "canceled", done
        assert stopped == [second.id]
        await wait_status(store, first.id, "canceled")
    assert hook.calls == [[first.id]]


async def test_a_raising_lease_overrun_hook_leaves_the_lease_guard_running(
    store: TaskStore, client: CairnQ, dialect: str, db_target: str
) -> None:
    worker = Worker(
        store,
        concurrency=2,
        lease_ms=LEASE_MS,
        poll_interval_ms=50,
        prefetch=0,
        on_error=ErrorLog(),
    )
    hook = worker.on_lease_overrun = RaisingHook()
    started = threading.Event()
    release = threading.Event()
    cancelled = asyncio.Event()

    @worker.task("stubborn")
    def stubborn(ctx: TaskContext, payload: Any) -> str:
        if ctx.attempt == 1:
            started.set()
            release.wait(60)
        return "late"

    @worker.task("long")
    async def long(ctx: TaskContext, payload: Any) -> str:
        if ctx.attempt == 1:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return "again"

    loop = asyncio.get_running_loop()
    first = await client.submit("stubborn", {}, max_attempts=3)
    async with running(worker, stop_timeout=60):
        try:
            await loop.run_in_executor(None, started.wait, 20)
            async with database_locked_async(dialect, db_target, HELD_S):
                await eventually(lambda: hook.calls, within=20, what="on_lease_overrun")
        finally:
            release.set()
        # The guard goes on: a handler whose lease cannot be renewed is still stopped.
        second = await client.submit("long", {}, max_attempts=3)
        await wait_status(store, second.id, "running")
        async with database_locked_async(dialect, db_target, HELD_S):
            await eventually(cancelled.is_set, within=20, what="the second handler stopped")
        done = await wait_status(store, second.id, within=60)
        await wait_status(store, first.id, within=60)
    assert (done.status, done.result) == ("succeeded", "again"), done
    assert hook.calls == [[first.id]]
