"""A worker's per-queue counts, added to the database every `FLUSH_EVERY_S` and once
more when it stops (cairnqd/queue_counts.py). A write that fails keeps its counts for
the next one; the outage is logged once, and once more when writes get through. After
its first write and then hourly, a worker also forgets the rows older than any chart
shows: a few indexed deletes, so that no daemon or purge rule is needed for it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from cairnqd._heartbeat import end_if_cancelled
from cairnqd.queue_counts import FLUSH_EVERY_S, QueueTally, rows_of
from cairnqd.store.base import TaskStore

log = logging.getLogger("cairnqd.worker")

#: The last write when a worker stops may take this long before its counts are dropped.
_LAST_WRITE_S = 2.0
_PRUNE_EVERY_S = 3600.0


class CountFlusher:
    def __init__(self, store: TaskStore, tally: QueueTally) -> None:
        self.store = store
        self.tally = tally
        self._failing = False
        self._next_prune = 0.0

    async def run(self) -> None:
        """Write every `FLUSH_EVERY_S` until cancelled."""
        while True:
            await asyncio.sleep(FLUSH_EVERY_S)
            await self.flush()
            end_if_cancelled()  # a cancellation the driver lost (_heartbeat.py)

    async def flush(self) -> None:
        counts = self.tally.take()
        if not counts:
            return
        try:
            await self.store.queue_counts.add(rows_of(counts))
        except Exception as exc:
            self.tally.give_back(counts)
            if not self._failing:
                self._failing = True
                log.warning(
                    "cannot write the per-queue counts (kept for the next try): %s",
                    " ".join(str(exc).split()) or type(exc).__name__,
                )
            return
        if self._failing:
            self._failing = False
            log.info("per-queue counts are written again")
        if time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + _PRUNE_EVERY_S
            try:
                await self.store.queue_counts.prune(int(time.time() * 1000))
            except Exception as exc:  # the next hour's try will do
                log.debug("cannot forget old per-queue counts: %s", exc)

    async def last(self) -> None:
        """The final write of a stopping worker, bounded in time."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), _LAST_WRITE_S)


__all__ = ["CountFlusher"]
