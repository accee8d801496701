"""Which of a worker's queues an operator paused (`cairnqd pause --queue Q`).

Read only by a worker that opts in (`Worker(honour_pauses=True)`), at most once per
`refresh_s`; a failed read keeps the last known set (docs/architecture.md, "Queue
pauses").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from cairnqd.store.base import TaskStore

#: Seconds between two reads of the pause table.
PAUSE_REFRESH_S = 0.5

ErrorReporter = Callable[[BaseException, dict[str, Any]], None]


class PausedQueues:
    def __init__(
        self,
        store: TaskStore,
        queues: Sequence[str],
        report: ErrorReporter,
        *,
        refresh_s: float = PAUSE_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._queues = list(queues)
        self._report = report
        self.refresh_s = refresh_s
        self._clock = clock
        self._next_read = 0.0
        #: This worker's queues found paused at the last successful read.
        self.paused: frozenset[str] = frozenset()

    async def active(self) -> list[str]:
        """This worker's queues that are not paused, from a read at most `refresh_s`
        old; the caller claims from these only."""
        now = self._clock()
        if now >= self._next_read:
            self._next_read = now + self.refresh_s
            try:
                pauses = await self._store.pauses.all()
            except Exception as exc:
                self._report(exc, {"phase": "queue pauses"})
            else:
                mine = set(self._queues)
                self.paused = frozenset(p.queue for p in pauses if p.queue in mine)
        return [q for q in self._queues if q not in self.paused]

    def wait_cap_ms(self, poll_interval_ms: int) -> int:
        """How long an idle worker may wait before looking again: the poll
        interval, or `refresh_s` while one of its queues is paused."""
        if not self.paused:
            return poll_interval_ms
        return min(poll_interval_ms, int(self.refresh_s * 1000))
