"""The lease reaper: recover every expired lease, once at start and then every
`reaper.interval`. Every host runs it; the protocol's `recover_leases` skips rows
another recoverer holds."""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

from cairnqd.config import Config
from cairnqd.daemon.parent.parent_store import parent_store
from cairnqd.store.base import Row, TaskStore

if TYPE_CHECKING:
    from cairnqd.daemon.parent.metrics import Metrics

log = logging.getLogger("cairnqd.maintenance")


def reaper_store(config: Config) -> TaskStore:
    """The maintenance thread's store. On SQLite it rides out a forward step of the wall
    clock for as long as the longest lease of the config's groups (store/clockstep.py),
    so the reaper takes no live lease for expired before its worker renewed it."""
    store = parent_store(config.database)
    if store.clock_watch is not None:
        leases = [group.lease.total_seconds() for group in config.groups.values()]
        store.clock_watch.at_least(max(leases, default=0.0))
    return store


def count_recoveries(metrics: Metrics, rows: list[Row], reason: str) -> None:
    """`cairnq_lease_recoveries_total` for recovered rows, by queue."""
    for queue, n in Counter(str(r["queue"]) for r in rows).items():
        metrics.lease_recoveries(queue, reason, n)


async def reap(store: TaskStore, metrics: Metrics) -> int:
    """Recover every expired lease now; how many tasks were recovered."""
    rows = await store.recover_leases()
    count_recoveries(metrics, rows, "expired")
    if rows:
        log.info("recovered %d task(s) with expired leases", len(rows))
    return len(rows)


__all__ = ["count_recoveries", "reap", "reaper_store"]
