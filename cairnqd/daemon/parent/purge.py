"""The retention purge: one sweep over `retention.rules` per `retention.interval`,
never at boot. Per rule, bounded batches until one comes back short or `max_batches`
is reached. One host sweeps per interval: it must take the purge's turn
(`store.leadership.take_turn`) and then the purge lock (`exclusive`), so sweeps never
overlap or run back to back on two hosts."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from cairnqd.config import Config, PurgeRule, to_ms
from cairnqd.store.base import TaskStore

if TYPE_CHECKING:
    from cairnqd.daemon.parent.metrics import Metrics

log = logging.getLogger("cairnqd.maintenance")

#: Second key of the purge lock; the stats leader uses 2 (metrics/database.py).
PURGE_LOCK_ID = 1


class Purge:
    def __init__(
        self,
        config: Callable[[], Config],
        metrics: Metrics,
        *,
        halted: Callable[[], bool],
        between_batches: Callable[[], Awaitable[None]],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        # The config as it is now (reloads change the rules and batch sizes).
        self._config = config
        self._metrics = metrics
        self._halted = halted
        # Runs before each batch: urgent hand-backs go first even mid-sweep.
        self._between_batches = between_batches
        self._wall_clock = wall_clock

    async def turn(self, store: TaskStore) -> int | None:
        """The scheduled sweep: `sweep` if this host takes the purge's turn, which one
        host per `retention.interval` gets across every host on the database."""
        config = self._config()
        if not config.retention.rules or self._halted():
            return None
        interval_ms = to_ms(config.retention.interval)
        # A little short of the interval, so the sweeping host's own next tick (timed
        # on its clock, checked on the database's) finds its turn due again.
        every_ms = interval_ms - min(1000, interval_ms // 10)
        turn = f"purge:{config.database.lock_namespace}"
        if not await store.leadership.take_turn(turn, every_ms):
            log.debug("another host purged within this interval; skipping this one")
            return None
        return await self.sweep(store)

    async def sweep(self, store: TaskStore) -> int | None:
        """One sweep over every rule; rows deleted, or None when it did not run (no
        rules, paused or stopping, or another host holds the purge lock)."""
        config = self._config()
        rules = config.retention.rules
        if not rules or self._halted():
            return None
        namespace = config.database.lock_namespace
        async with store.leadership.exclusive(namespace, PURGE_LOCK_ID) as held:
            if not held:
                log.debug("another host is purging; skipping this interval")
                return None
            return await self._sweep(store, rules)

    async def _sweep(self, store: TaskStore, rules: tuple[PurgeRule, ...]) -> int:
        self._metrics.purge_started()
        deleted = 0
        try:
            for index, rule in enumerate(rules):
                deleted += await self._purge_rule(store, index, rule)
            if deleted:
                await store.after_purge()
        except Exception:
            self._metrics.purge_failed()
            raise
        if self._halted():
            log.info("purge sweep interrupted after deleting %d task(s)", deleted)
            return deleted
        self._metrics.purge_succeeded(self._wall_clock())
        if deleted:
            log.info("purge sweep deleted %d task(s)", deleted)
        return deleted

    async def _purge_rule(self, store: TaskStore, index: int, rule: PurgeRule) -> int:
        retention = self._config().retention
        deleted = 0
        for batch_no in range(retention.max_batches):
            await self._between_batches()
            if self._halted():
                break
            if batch_no and store.purge_batch_pause_s:
                # Let the workers' writes in between two of our write transactions.
                await asyncio.sleep(store.purge_batch_pause_s)
            ids = await store.purge(
                older_than_ms=to_ms(rule.older_than),
                queue=rule.queue,
                status=rule.status,
                name=rule.name,
                limit=retention.batch,
            )
            self._metrics.purge_deleted(str(index), len(ids))
            deleted += len(ids)
            if len(ids) < retention.batch:
                break
        return deleted


__all__ = ["PURGE_LOCK_ID", "Purge"]
