"""Lease renewal: one heartbeat loop per worker renews every in-flight lease with a
single `heartbeat_batch` per beat (`max(50, lease_ms // 3)` ms), whatever the number of
tasks held.

An id missing from the reply marks that context lease-lost (recovered elsewhere; its
handler may no longer write), and a cancel flag marks it cancel-seen, so
`ctx.canceled()` answers without a round trip. A failed beat is reported and the next
one tries again (a lease outlasts about three beats).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cairnqd.worker import Worker


async def heartbeat_loop(worker: Worker) -> None:
    interval = max(50, worker.lease_ms // 3) / 1000
    while True:
        await asyncio.sleep(interval)
        await beat(worker)


async def beat(worker: Worker) -> None:
    """Renew every live lease the worker holds, in one statement."""
    live = [c for c in worker._contexts.values() if not c.settled and not c.lost_lease]
    if not live:
        return
    try:
        beats = await worker.store.heartbeat_batch(
            task_ids=[c.task_id for c in live],
            worker_id=worker.worker_id,
            lease_ms=worker.lease_ms,
        )
    except Exception as exc:
        worker._report(exc, {"phase": "heartbeat"})
        return
    for ctx in live:
        seen = beats.get(ctx.task_id)
        if seen is None:
            if not ctx.settled:
                ctx._mark_lost()
        elif seen:
            ctx._mark_cancel_seen()
