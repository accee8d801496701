"""`QueueCounts`: the per-queue counters of finished tasks (`cairnqd_queue_counts`,
cairnqd/queue_counts.py) that workers add to and the dashboard's charts read."""

from __future__ import annotations

import json
from collections.abc import Sequence

from cairnqd.queue_counts import KEEP_MS, WIDTHS_S, CountRow
from cairnqd.store.arguments import INT8_MAX, require_int
from cairnqd.store.executor import Executor

#: Rows per statement when adding: a flush of many queues after an outage is cut in
#: several statements rather than one unbounded JSON document.
_ADD_BATCH = 2000


def _check_width(width_s: int) -> int:
    if width_s not in WIDTHS_S:
        raise ValueError(f"width_s must be one of {', '.join(map(str, WIDTHS_S))}, got {width_s!r}")
    return width_s


class QueueCounts:
    def __init__(self, executor: Executor) -> None:
        self._db = executor

    async def add(self, rows: Sequence[CountRow]) -> None:
        """Add `rows` to the counters, in one transaction."""
        if not rows:
            return
        async with self._db.transaction() as session:
            for i in range(0, len(rows), _ADD_BATCH):
                counts = json.dumps(
                    [
                        {
                            "w": r.width_s,
                            "t": r.start_ms,
                            "q": r.queue,
                            "s": r.series,
                            "b": r.bucket,
                            "n": r.n,
                        }
                        for r in rows[i : i + _ADD_BATCH]
                    ]
                )
                await session.fetch("extensions/queue_counts_add", {"counts": counts})

    async def read(self, width_s: int, since_ms: int) -> list[CountRow]:
        """Every row of width `width_s` whose period began at `since_ms` or later."""
        _check_width(width_s)
        require_int(since_ms, "since_ms", minimum=0, maximum=INT8_MAX)
        rows = await self._db.scan(
            "extensions/queue_counts_read",
            {"width_s": width_s, "since_ms": since_ms},
            frozenset(),
            list,
        )
        return [
            CountRow(width_s, r["start_ms"], r["queue"], r["series"], r["bucket"], r["n"])
            for r in rows
        ]

    async def prune(self, now_ms: int) -> None:
        """Forget the rows older than any chart of their width shows."""
        require_int(now_ms, "now_ms", minimum=0, maximum=INT8_MAX)
        for width in WIDTHS_S:
            await self._db.fetch(
                "extensions/queue_counts_prune",
                {"width_s": width, "cutoff_ms": now_ms - KEEP_MS[width]},
            )


__all__ = ["QueueCounts"]
