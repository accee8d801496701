"""Lease renewal: one heartbeat loop per worker renews every in-flight lease with a
single `heartbeat_batch` per beat (`max(50, lease_ms // 3)` ms), whatever the number of
tasks held.

An id missing from the reply marks that context lease-lost (recovered elsewhere; its
handler may no longer write), and a cancel flag marks it cancel-seen, so
`ctx.canceled()` answers without a round trip. A renewal moves the task's local lease
deadline to the moment the beat was sent plus the lease; a task whose deadline passes
without one is never renewed again (`InFlight.renewable`). A failed beat is reported
and retried sooner than the next beat would come (`RETRY_SHARE` of the interval), so a
passing error costs little of the lease; a beat that stalls is waited for. Either way, a
handler whose lease cannot be renewed in time is stopped by the lease guard
(`_leaseguard`), not here.
"""

from __future__ import annotations

import asyncio

from cairnqd._inflight import InFlight
from cairnqd.store.base import TaskStore

#: After a failed beat, the next try comes after this share of the interval.
RETRY_SHARE = 0.25


async def heartbeat_loop(store: TaskStore, inflight: InFlight) -> None:
    interval = max(50, inflight.lease_ms // 3) / 1000
    delay = interval
    while True:
        await asyncio.sleep(delay)
        delay = interval if await beat(store, inflight) else interval * RETRY_SHARE


async def beat(store: TaskStore, inflight: InFlight) -> bool:
    """Renew every live lease the worker holds, in one statement; False if it failed."""
    live = inflight.renewable()
    if not live:
        return True
    sent_at = inflight.clock()
    progress = inflight.progress
    progress.begin()
    try:
        reply = await store.renew_leases(
            task_ids=[c.task_id for c in live],
            worker_id=inflight.worker_id,
            lease_ms=inflight.lease_ms,
        )
    except BaseException as exc:
        progress.failed()
        if not isinstance(exc, Exception):
            raise
        inflight.report(exc, {"phase": "heartbeat"})
        return False
    progress.succeeded()
    inflight.renewed(live, sent_at, reply)
    return True
