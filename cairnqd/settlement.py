"""Writing returned results: the worker's settlement batcher.

Results a handler returns are queued here and written as set-based `complete_many`
statements, with `complete`'s per-row rules. A busy claim loop carries them inside its
next claim transaction (one commit per cycle instead of two); otherwise a flusher
writes them at once. It never waits for a batch to fill: a result reaches the database
as soon as the previous write ends.
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import TYPE_CHECKING

import psycopg

from .errors import DatabaseUnavailable, StoreClosed
from .models import Task

if TYPE_CHECKING:
    from .context import TaskContext
    from .worker import Worker


class CompleteBatcher:
    """Writes returned results as set-based `complete_many` statements.

    A complete that arrives while a write is in flight joins the next write; the first
    one after an idle spell is written at once. Same per-row rules as `complete`: a row
    missing from the reply lost its lease.
    """

    # Queued-but-unwritten results beyond this many make handlers wait for the writer.
    MAX_BACKLOG_PER_SLOT = 4
    MAX_WRITE_ATTEMPTS = 20
    PIGGYBACK_WAIT_S = 0.002
    PREFETCH_WAIT_S = 0.01

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self._pending: list[tuple[TaskContext, str | None]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._retrying = False

    def enqueue(self, ctx: TaskContext, encoded: str | None) -> None:
        """Queue a result; the handler's call slot is free as soon as this returns."""
        self._pending.append((ctx, encoded))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())

    async def backpressure(self) -> None:
        worker = self._worker
        limit = self.MAX_BACKLOG_PER_SLOT * max(1, worker.concurrency + worker.prefetch)
        while len(self._pending) > limit and self._flusher is not None:
            await asyncio.shield(self._flusher)

    async def drain(self) -> None:
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
        """Return results to the queue (a claim failed) and make sure a writer runs."""
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
                    worker._report_end(ctx, _status_only(ctx.task, status))
            worker._forget(ctx)

    async def _flush(self) -> None:
        worker = self._worker
        failures = 0
        try:
            # A busy claim loop carries queued results in its next claim transaction
            # (one commit instead of two); give it a moment before writing them alone.
            if not worker._idling:
                # A prefetching worker claims again every half backlog: worth waiting
                # a little longer for, while results keep piling up behind it.
                wait = self.PREFETCH_WAIT_S if worker.prefetch else self.PIGGYBACK_WAIT_S
                await asyncio.sleep(wait)
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
                await worker._settle_quietly(worker._settle_fail(ctx, envelope, False), ctx)


def _status_only(task: Task, status: str) -> Task:
    copy = Task(**{**task.__dict__})
    copy.status = status  # type: ignore[assignment]
    return copy


def _transient(exc: BaseException) -> bool:
    """Errors worth retrying as they are: the database was busy or unreachable."""
    return isinstance(
        exc, sqlite3.OperationalError | psycopg.OperationalError | DatabaseUnavailable | OSError
    )
