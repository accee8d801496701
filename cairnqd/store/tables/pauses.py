"""`QueuePauses`: the operator's queue pauses (`cairnqd_queue_pauses`), which only
workers that honour pauses read; the protocol's tables never learn of them."""

from __future__ import annotations

from collections.abc import Sequence

from cairnqd.store.arguments import Params, require_str
from cairnqd.store.executor import Executor
from cairnqd.store.operator import QueuePause, check_queue_name, check_reason


class QueuePauses:
    def __init__(self, executor: Executor) -> None:
        self._db = executor

    async def all(self) -> list[QueuePause]:
        """Every paused queue, by name."""
        rows = await self._db.fetch("extensions/queue_pauses", {})
        return [QueuePause.from_row(r) for r in rows]

    async def pause(
        self, queues: Sequence[str], *, paused_by: str, reason: str | None = None
    ) -> list[QueuePause]:
        """Pause `queues` in one transaction; the pauses this call made (a queue
        paused already keeps its earlier pause and is left out)."""
        names = [check_queue_name(q, "queues[]") for q in queues]
        require_str(paused_by, "paused_by")
        params: Params = {"paused_by": paused_by, "reason": check_reason(reason)}
        made = []
        async with self._db.transaction() as session:
            for queue in dict.fromkeys(names):
                made += await session.fetch("extensions/queue_pause", {**params, "queue": queue})
        return [QueuePause.from_row(r) for r in made]

    async def resume(self, queues: Sequence[str]) -> list[QueuePause]:
        """Resume `queues` in one transaction; the pauses it ended."""
        names = [check_queue_name(q, "queues[]") for q in queues]
        ended = []
        async with self._db.transaction() as session:
            for queue in dict.fromkeys(names):
                ended += await session.fetch("extensions/queue_resume", {"queue": queue})
        return [QueuePause.from_row(r) for r in ended]


__all__ = ["QueuePauses"]
