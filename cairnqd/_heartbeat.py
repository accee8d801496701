"""Lease renewal: one `renew_leases` per beat renews every in-flight lease.

Each lease is renewed for the attempt the worker holds and never moved earlier, so a
renewal that reaches the database late (it waited on a lock) cannot shorten a lease or
renew a later attempt of the same task. A missing id marks its task lease-lost, a
cancel flag marks it cancel-seen; a renewal moves the local deadline to the beat's send
time plus the lease (never earlier), and a failed beat is retried after `RETRY_SHARE`
of the interval. Stopping a handler whose lease cannot be renewed is the lease guard's
job (docs/architecture.md, "Renewals").
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
        end_if_cancelled()


def end_if_cancelled() -> None:
    """End a helper loop that was asked to stop even though the await it was in did
    not raise: a cancellation that lands just as a Postgres statement is answered can
    be lost on its way out of the driver, and the loop then went on for ever, so a
    stopping `Worker.run()`, which waits for it, never returned (seen on a drain's
    last renewal). Only the worker cancels these loops."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def beat(store: TaskStore, inflight: InFlight) -> bool:
    """Renew every live lease the worker holds, in one statement; False if it failed."""
    live = inflight.renewable()
    if not live:
        return True
    renewal = await renew(store, inflight, [(c.task_id, c.attempt) for c in live])
    if renewal is None:
        return False
    sent_at, reply = renewal
    inflight.renewed(live, sent_at, reply)
    return True


async def renew(
    store: TaskStore, inflight: InFlight, held: list[tuple[str, int]]
) -> tuple[float, dict[str, tuple[int, bool]]] | None:
    """One `renew_leases` of `held` (task id, attempt) pairs: when it was sent (the
    local lease of each row renewed runs from then) and the reply; None if it failed
    (reported)."""
    sent_at = inflight.clock()
    progress = inflight.progress
    progress.begin()
    try:
        reply = await store.renew_leases(
            held=held, worker_id=inflight.worker_id, lease_ms=inflight.lease_ms
        )
    except BaseException as exc:
        progress.failed()
        if not isinstance(exc, Exception):
            raise
        inflight.report(exc, {"phase": "heartbeat"})
        return None
    progress.succeeded()
    return sent_at, reply
