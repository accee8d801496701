"""Lease renewal: one heartbeat loop per worker renews every in-flight lease with a
single `heartbeat_batch` per beat (`max(50, lease_ms // 3)` ms), whatever the number of
tasks held.

An id missing from the reply marks that context lease-lost (recovered elsewhere; its
handler may no longer write), and a cancel flag marks it cancel-seen, so
`ctx.canceled()` answers without a round trip. A renewal moves the task's local lease
deadline to the moment the beat was sent plus the lease; a task whose deadline passes
without one is never renewed again (`InFlight.renewable`). A failed beat is reported
and the next one tries again (a lease outlasts about three beats).
"""

from __future__ import annotations

import asyncio

from cairnqd._inflight import InFlight
from cairnqd.store.base import TaskStore


async def heartbeat_loop(store: TaskStore, inflight: InFlight) -> None:
    interval = max(50, inflight.lease_ms // 3) / 1000
    while True:
        await asyncio.sleep(interval)
        await beat(store, inflight)


async def beat(store: TaskStore, inflight: InFlight) -> None:
    """Renew every live lease the worker holds, in one statement."""
    live = inflight.renewable()
    if not live:
        return
    sent_at = inflight.clock()
    try:
        reply = await store.renew_leases(
            task_ids=[c.task_id for c in live],
            worker_id=inflight.worker_id,
            lease_ms=inflight.lease_ms,
        )
    except Exception as exc:
        inflight.report(exc, {"phase": "heartbeat"})
        return
    inflight.renewed(live, sent_at, reply)
