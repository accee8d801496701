"""Writing returned results: the worker's settlement batcher.

Results a handler returns are queued here and written as set-based `complete_many`
statements, with `complete`'s per-row rules.

Who writes them: while the worker's claim loop is running, the claim loop does. Its
next claim transaction carries every queued result, so a busy worker pays one commit
per cycle for finishing the last tasks and claiming the next ones. A result never
waits longer than `SETTLE_WAIT_S` (`PREFETCH_SETTLE_WAIT_S` for a worker claiming
ahead, whose claims are further apart) for that: when it is due, the claim loop runs a
cycle just for it, which also tops up the backlog. When no claim is coming (the worker
is idle, stopping, or told not to claim) a flusher writes them at once instead, and it
is also what retries a write that failed.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import TYPE_CHECKING

import psycopg

from cairnqd.errors import DatabaseUnavailable, StoreClosed
from cairnqd.models import Task

if TYPE_CHECKING:
    from cairnqd.context import TaskContext
    from cairnqd.worker import Worker


class CompleteBatcher:
    """Writes returned results as set-based `complete_many` statements.

    Results queue here until the claim loop takes them into its next claim (`take`),
    or, when no claim is coming, until the flusher writes them; a result queued while
    the flusher writes joins its next write. Same per-row rules as `complete`: a row
    missing from the reply lost its lease.
    """

    # Queued-but-unwritten results beyond this many make handlers wait for the writer.
    MAX_BACKLOG_PER_SLOT = 4
    MAX_WRITE_ATTEMPTS = 20
    SETTLE_WAIT_S = 0.002
    PREFETCH_SETTLE_WAIT_S = 0.01

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self._pending: list[tuple[TaskContext, str | None]] = []
        self._oldest = 0.0  # monotonic time the oldest pending result was queued
        self._flusher: asyncio.Task[None] | None = None
        self._retrying = False

    def enqueue(self, ctx: TaskContext, encoded: str | None) -> None:
        """Queue a result; the handler's call slot is free as soon as this returns."""
        first = not self._pending
        self._pending.append((ctx, encoded))
        if self._flusher is not None:
            return  # the running writer picks it up
        if not self._worker._claims_will_settle():
            self._flusher = asyncio.create_task(self._flush())
        elif first:
            self._oldest = time.monotonic()
            # Wake the claim loop when this result is due, even if nothing else does.
            asyncio.get_running_loop().call_later(self._wait_s(), self._worker._wake)

    def _wait_s(self) -> float:
        return self.PREFETCH_SETTLE_WAIT_S if self._worker._ahead else self.SETTLE_WAIT_S

    def due(self) -> bool:
        """Whether the claim loop should run a cycle now to write queued results."""
        if not self._pending or self._flusher is not None or self._retrying:
            return False
        return time.monotonic() - self._oldest >= self._wait_s()

    def backlogged(self) -> bool:
        """More results queued than the writer is keeping up with."""
        worker = self._worker
        limit = self.MAX_BACKLOG_PER_SLOT * max(1, worker.concurrency + worker._ahead)
        return len(self._pending) > limit

    async def backpressure(self) -> None:
        """Wait while `backlogged()` and a writer is working through it."""
        while self.backlogged() and self._flusher is not None:
            await asyncio.shield(self._flusher)

    async def drain(self) -> None:
        """Write everything queued (the claim loop has ended)."""
        self.put_back([])
        while self._flusher is not None:
            await asyncio.shield(self._flusher)

    def take(self) -> list[tuple[TaskContext, str | None]]:
        """Hand the queued results to the claim loop, to write inside its claim.
        Not while a failed batch is being retried: the claim would fail with it."""
        if self._retrying:
            return []
        batch, self._pending = self._pending, []
        return batch

    @property
    def pending(self) -> int:
        return len(self._pending)

    def put_back(self, batch: list[tuple[TaskContext, str | None]]) -> None:
        """Return results to the queue (a claim failed) and make sure a writer runs;
        with an empty batch: write what is queued now, no claim is coming."""
        if batch:
            self._retrying = True
        self._pending[:0] = batch
        if self._pending and self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())

    def finish(self, batch: list[tuple[TaskContext, str | None]], statuses: dict[str, str]) -> None:
        worker = self._worker
        for ctx, _ in batch:
            status = statuses.get(ctx.task_id)
            if status is None:
                ctx._mark_lost()
            else:
                ctx._mark_settled()
                if worker.observer is not None:
                    worker._runner.report_end(ctx, _status_only(ctx.task, status))
            worker._forget(ctx)

    async def _flush(self) -> None:
        worker = self._worker
        failures = 0
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    statuses = await self._write(batch)
                except Exception as exc:
                    if not _transient(exc):
                        # One row the database refuses fails the whole statement:
                        # write each result alone so only that task is affected.
                        await self._write_each(batch)
                        continue
                    # Not written: the leases stay ours and the heartbeat keeps them,
                    # so put the batch back and try again shortly. After a few seconds
                    # give up; the leases then expire and the tasks are redelivered.
                    worker._report(exc, {"phase": "execute", "tasks": len(batch)})
                    failures += 1
                    if failures < self.MAX_WRITE_ATTEMPTS and not isinstance(exc, StoreClosed):
                        self._pending[:0] = batch
                        await asyncio.sleep(0.25)
                    else:
                        for ctx, _ in batch:
                            worker._forget(ctx)
                    continue
                failures = 0
                self.finish(batch, statuses)
        finally:
            self._flusher = None
            self._retrying = False

    async def _write(self, batch: list[tuple[TaskContext, str | None]]) -> dict[str, str]:
        return await self._worker.store.complete_many(
            worker_id=self._worker.worker_id,
            items=[(ctx.task_id, encoded) for ctx, encoded in batch],
        )

    async def _write_each(self, batch: list[tuple[TaskContext, str | None]]) -> None:
        worker = self._worker
        for ctx, encoded in batch:
            try:
                self.finish([(ctx, encoded)], await self._write([(ctx, encoded)]))
            except Exception as exc:
                worker._report(exc, {"phase": "execute", "task_id": ctx.task_id})
                if _transient(exc):
                    worker._forget(ctx)  # its lease expires and the task is redelivered
                    continue
                envelope = {
                    "type": type(exc).__name__,
                    "code": "unserializable_result",
                    "message": f"the database refused the result: {exc}",
                    "retryable": False,
                    "details": {},
                }
                runner = worker._runner
                await runner.settle_quietly(runner.settle_fail(ctx, envelope, False), ctx)


def _status_only(task: Task, status: str) -> Task:
    copy = Task(**{**task.__dict__})
    copy.status = status  # type: ignore[assignment]
    return copy


def _transient(exc: BaseException) -> bool:
    """Errors worth retrying as they are: the database was busy or unreachable."""
    return isinstance(
        exc, sqlite3.OperationalError | psycopg.OperationalError | DatabaseUnavailable | OSError
    )
