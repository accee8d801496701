"""Lease renewal: one `heartbeat_batch` per beat renews every in-flight lease.

A missing id marks its task lease-lost, a cancel flag marks it cancel-seen; a renewal
moves the local deadline to the beat's send time plus the lease, and a failed beat is
retried after `RETRY_SHARE` of the interval. Stopping a handler whose lease cannot be
renewed is the lease guard's job (docs/architecture.md, "Renewals").
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
