"""Group commit for keyless submits: callers that submit together share one
`insert_many`, and each keeps its own outcome (docs/architecture.md, "Coalesced
submits").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from cairnqd.models import Task
from cairnqd.store.errors import is_transient

log = logging.getLogger("cairnqd.store")

#: The most submits one statement carries; more wait for the next one.
MAX_BATCH = 1000

InsertOne = Callable[[dict[str, object]], Awaitable[Task]]
InsertMany = Callable[[Sequence[dict[str, object]]], Awaitable[list[Task]]]


@dataclass
class _Waiting:
    params: dict[str, object]
    future: asyncio.Future[Task] = field(repr=False)


class SubmitCoalescer:
    """Queues keyless submits and writes them in batches, one batch at a time."""

    def __init__(
        self, insert_one: InsertOne, insert_many: InsertMany, *, max_batch: int = MAX_BATCH
    ) -> None:
        self._insert_one = insert_one
        self._insert_many = insert_many
        self._max_batch = max_batch
        self._queue: list[_Waiting] = []
        self._writer: asyncio.Task[None] | None = None
        #: A lone write runs in its caller's task; `drain` waits on `_lone_done`, made
        #: only when someone drains during one (a future per submit costs time).
        self._lone = False
        self._lone_done: asyncio.Event | None = None
        #: Statements written and submits they carried (for tests and the bench).
        self.statements = 0
        self.submits = 0

    async def submit(self, params: dict[str, object]) -> Task:
        if self._writer is None and not self._lone:
            return await self._submit_alone(params)
        waiting = _Waiting(params, asyncio.get_running_loop().create_future())
        self._queue.append(waiting)
        self._start_writer()
        try:
            # Shielded: the writer resolves the future; a cancelled caller only leaves.
            return await asyncio.shield(waiting.future)
        except asyncio.CancelledError:
            if waiting in self._queue:
                self._queue.remove(waiting)  # not written yet: it never will be
            elif not waiting.future.done():
                waiting.future.add_done_callback(_consume)
            raise

    async def _submit_alone(self, params: dict[str, object]) -> Task:
        """The fast path: write in the caller's task while others queue behind it."""
        self._lone = True
        self.statements += 1
        self.submits += 1
        try:
            return await self._insert_one(params)
        finally:
            self._lone = False
            if self._lone_done is not None:
                self._lone_done.set()
                self._lone_done = None
            self._start_writer()

    def _start_writer(self) -> None:
        """Start the writer for queued submits unless a write is already running (its
        end starts the writer)."""
        if self._queue and self._writer is None and not self._lone:
            self._writer = asyncio.create_task(self._write_all(), name="cairnqd-submits")

    async def drain(self) -> None:
        """Wait until everything queued so far has been written (or has failed)."""
        while self._writer is not None or self._lone:
            if self._writer is not None:
                await asyncio.shield(self._writer)
            else:
                if self._lone_done is None:
                    self._lone_done = asyncio.Event()
                await self._lone_done.wait()

    async def _write_all(self) -> None:
        batch: list[_Waiting] = []
        try:
            while self._queue:
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
                await self._write(batch)
                if len(batch) > 1:
                    await _let_callers_return()
        except BaseException:
            # The writer itself was cancelled (its loop is closing): nobody will write
            # these, so their callers must not wait forever.
            for waiting in [*batch, *self._queue]:
                waiting.future.cancel()
            self._queue.clear()
            raise
        finally:
            self._writer = None

    async def _write(self, batch: list[_Waiting]) -> None:
        self.statements += 1
        self.submits += len(batch)
        if len(batch) == 1:
            await self._write_alone(batch[0])
            return
        try:
            tasks = await self._insert_many([w.params for w in batch])
        except Exception as exc:
            if is_transient(exc):
                for waiting in batch:
                    _settle(waiting.future, error=exc)
                return
            log.debug("a batch of %d submits failed (%s); writing each alone", len(batch), exc)
            for waiting in batch:
                await self._write_alone(waiting)
            return
        for waiting, task in zip(batch, tasks, strict=True):
            _settle(waiting.future, task=task)

    async def _write_alone(self, waiting: _Waiting) -> None:
        try:
            task = await self._insert_one(waiting.params)
        except Exception as exc:
            _settle(waiting.future, error=exc)
        else:
            _settle(waiting.future, task=task)


async def _let_callers_return() -> None:
    """Two turns of the loop: callers whose futures a batch just settled resume (the
    shield's callback, then their task), and those that submit again queue here. Were the
    writer gone by then, the first of them would find nothing running and write alone,
    and the rest would queue behind that one-row write: two commits a round instead of
    one (bench/RESULTS.md, "How submits are written")."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def _settle(
    future: asyncio.Future[Task], *, task: Task | None = None, error: Exception | None = None
) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        assert task is not None
        future.set_result(task)


def _consume(future: asyncio.Future[Task]) -> None:
    """Retrieve the outcome nobody awaits any more, so asyncio does not log it."""
    if not future.cancelled():
        future.exception()
