"""No two executions of one task overlap, even when the database stalls past the lease.

Another process holds SQLite's write lock, or a Postgres session holds `LOCK TABLE`, for
longer than the lease while a long handler runs. The worker cannot renew, so its lease
ends in the database and the task is recovered and run again once the lock goes. The
worker must have stopped the first execution before its lease could end: before, the
handler ran on, and the second execution started beside it.

Executions are recorded as (task, attempt, start, end) on one monotonic clock, the
handler's `finally` writing the end whether it returned or was cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.locks import database_locked_async
from tests.support.worker import eventually, running, wait_status

LEASE_MS = 2000
HELD_S = 4.5  # longer than the lease: the database lease ends while the lock is held
HANDLER_S = 12.0  # long enough to still run when a second execution could start


@dataclass
class Run:
    attempt: int
    started: float
    ended: float | None = None
    cancelled: bool = False


class Runs:
    """Every execution of the test's handler, on the monotonic clock."""

    def __init__(self) -> None:
        self.runs: list[Run] = []

    @contextlib.contextmanager
    def record(self, attempt: int) -> Iterator[Run]:
        run = Run(attempt, time.monotonic())
        self.runs.append(run)
        try:
            yield run
        except asyncio.CancelledError:
            run.cancelled = True
            raise
        finally:
            run.ended = time.monotonic()

    def overlapping(self) -> list[tuple[Run, Run]]:
        pairs = []
        for i, first in enumerate(self.runs):
            for second in self.runs[i + 1 :]:
                first_end = first.ended if first.ended is not None else float("inf")
                second_end = second.ended if second.ended is not None else float("inf")
                if first.started < second_end and second.started < first_end:
                    pairs.append((first, second))
        return pairs


async def test_a_stall_longer_than_the_lease_never_runs_a_task_twice_at_once(
    store: TaskStore, client: CairnQ, dialect: str, db_target: str
) -> None:
    runs = Runs()
    worker = Worker(store, concurrency=2, lease_ms=LEASE_MS, poll_interval_ms=50, prefetch=0)
    started = asyncio.Event()

    @worker.task("long")
    async def long(ctx: TaskContext, payload: Any) -> str:
        with runs.record(ctx.attempt):
            started.set()
            await asyncio.sleep(HANDLER_S)
        return "done"

    task = await client.submit("long", {}, max_attempts=3)
    async with running(worker, stop_timeout=HANDLER_S * 3):
        await asyncio.wait_for(started.wait(), 20)
        async with database_locked_async(dialect, db_target, HELD_S):
            pass
        # The task runs again once the lock is gone and its lease has ended.
        await eventually(lambda: len(runs.runs) >= 2, within=60, what="a second execution")
        done = await wait_status(store, task.id, within=60)
    assert done.status == "succeeded", done
    assert runs.runs[0].cancelled, runs.runs
    assert runs.overlapping() == [], runs.runs


async def test_a_handler_that_ignores_cancellation_is_reported_before_its_lease_ends(
    store: TaskStore, client: CairnQ, dialect: str, db_target: str
) -> None:
    # A bare worker cannot stop a thread (or a handler that swallows the cancel): it
    # says so through `on_lease_overrun` before the lease ends, and a host (the
    # daemon's child) aborts its process there.
    worker = Worker(store, lease_ms=LEASE_MS, poll_interval_ms=50, prefetch=0)
    overrun: list[tuple[float, list[TaskContext]]] = []
    deadlines: list[float] = []
    worker.on_lease_overrun = lambda contexts: overrun.append((time.monotonic(), list(contexts)))
    started = threading.Event()
    finish = threading.Event()

    @worker.task("stubborn")
    def stubborn(ctx: TaskContext, payload: Any) -> str:
        started.set()
        finish.wait(60)
        return "late"

    task = await client.submit("stubborn", {}, max_attempts=3)
    async with running(worker, stop_timeout=60):
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 20)
        async with database_locked_async(dialect, db_target, HELD_S):
            await eventually(lambda: overrun, within=20, what="on_lease_overrun")
            (ctx,) = overrun[0][1]
            deadlines.append(ctx.lease_deadline)
        finish.set()
    assert ctx.task_id == task.id
    # Called before the local lease deadline, which comes before the database's.
    assert overrun[0][0] < deadlines[0]
    assert ctx.lost_lease
