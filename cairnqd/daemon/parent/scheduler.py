"""The parent's scheduler: enqueues each slot of each configured schedule, once.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from cairnqd.config import Config, ScheduleConfig, to_ms
from cairnqd.daemon.parent.dbthread import LoopThread
from cairnqd.daemon.parent.parent_store import db_error_kind, parent_store
from cairnqd.schedules import from_ms, plan_due
from cairnqd.schedules import to_ms as slot_ms
from cairnqd.store.arguments import SubmitRequest
from cairnqd.store.base import TaskStore
from cairnqd.store.lazy import LazyStore
from cairnqd.store.leadership import LeaderLock
from cairnqd.store.reachability import is_unreachable
from cairnqd.store.tables.schedules import ScheduleRow, ScheduleTable, host_label, rule_of, slot_key

if TYPE_CHECKING:
    from cairnqd.daemon.parent.metrics import Metrics

__all__ = ["SCHEDULER_LOCK_ID", "Scheduler", "host_label", "slot_request"]

log = logging.getLogger("cairnqd.scheduler")

#: Second key of the scheduler's leader lock; purge uses 1, the stats leader 2.
SCHEDULER_LOCK_ID = 3
#: How often a host that does not lead asks for the lock: the takeover bound.
FOLLOW_INTERVAL_S = 1.0
#: The leader's longest sleep, so leadership and the metrics stay fresh.
LEAD_RECHECK_S = 5.0
#: How often the leader writes its name into the table (`cairnqd schedules`).
_MARK_INTERVAL_S = 10.0
_IDLE_S = 60.0
_ERROR_BACKOFF_S = 1.0


def slot_request(schedule: ScheduleConfig, slot: datetime, now_ms: int) -> SubmitRequest:
    """The submit of one slot: keyed by schedule and slot, delayed by its jitter."""
    at_ms = slot_ms(slot)
    return SubmitRequest(
        name=schedule.name,
        payload=schedule.payload,
        queue=schedule.queue,
        key=slot_key(schedule.schedule, at_ms),
        conflict="reuse",
        max_attempts=schedule.max_attempts,
        priority=schedule.priority,
        metadata={"schedule": schedule.schedule, "slot": _iso(slot)},
        delay_ms=max(0, at_ms + _jitter_ms(schedule, at_ms) - now_ms),
    )


def _jitter_ms(schedule: ScheduleConfig, at_ms: int) -> int:
    """A delay in [0, jitter) that every host computes alike for the same slot."""
    jitter = to_ms(schedule.jitter)
    if jitter <= 0:
        return 0
    digest = hashlib.sha256(f"{schedule.schedule}:{at_ms}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % jitter


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Scheduler:
    """The parent's scheduler thread; see the module docstring. `run_once()` is one
    pass, awaitable directly in tests with an injected `wall_clock`."""

    def __init__(
        self,
        config: Config,
        metrics: Metrics,
        *,
        store_factory: Callable[[], TaskStore] | None = None,
        wall_clock: Callable[[], float] | None = None,
        host: str | None = None,
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._store = LazyStore(store_factory or (lambda: parent_store(config.database)))
        self._wall_clock = wall_clock
        self.host = host or host_label()
        self._lock: LeaderLock | None = None
        self._leading: bool | None = None
        self._paused = threading.Event()
        self._stopping = threading.Event()
        self._thread = LoopThread("cairnqd-scheduler")
        self._serving: concurrent.futures.Future[None] | None = None
        self._wake: asyncio.Event | None = None
        self._problem: str | None = None
        #: While the database cannot be reached: since when, and failed passes not logged.
        self._outage: tuple[float, int] | None = None
        self._marked_at = 0.0
        self._first_seen: dict[str, float] = {}
        self._failures: dict[str, str] = {}

    # -- control, from any thread ---------------------------------------------------------

    def start(self) -> None:
        if self._serving is not None and not self._serving.done():
            return
        self._stopping.clear()
        self._thread.start()
        self._serving = self._thread.submit(self._serve())

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Give up the lead, close the store and end the thread. Idempotent."""
        serving = self._serving
        if serving is None:
            return True
        deadline = time.monotonic() + timeout_s
        self._stopping.set()
        self._thread.call_soon(self._set_wake)
        # Half the time to finish a pass; a call stuck on a silent database is then
        # cut short, so the rest is enough for the thread to end.
        clean = self._thread.finish_or_cut(serving, timeout_s / 2, self._sever, "scheduler", log)
        stopped = self._thread.stop(deadline - time.monotonic())
        self._serving = None
        return clean and stopped

    def _sever(self) -> None:
        """Cut the store's calls and the lead's own session short (on the loop)."""
        self._store.sever()
        if self._lock is not None:
            self._lock.sever()

    def pause(self) -> None:
        """Stop enqueuing and hand the lead over (the daemon is draining)."""
        self._paused.set()
        self._thread.call_soon(self._set_wake)

    def reconfigure(self, config: Config) -> None:
        """Apply a reload: added, changed and removed schedules from the next pass."""
        self._config = config
        self._thread.call_soon(self._set_wake)

    def database_problem(self) -> str | None:
        return self._problem

    @property
    def leading(self) -> bool:
        return bool(self._leading)

    def _set_wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- the loop ---------------------------------------------------------------------------

    async def _serve(self) -> None:
        self._wake = asyncio.Event()
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                try:
                    delay = await self.run_once()
                    self._problem = None
                    self._answered()
                except Exception as exc:
                    delay = _ERROR_BACKOFF_S
                    self._count_db_error(exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.0, delay))
        finally:
            await self.aclose()

    def _count_db_error(self, exc: BaseException) -> None:
        """Counted every time; logged once per outage when the database cannot be
        reached (a pass a second would otherwise log a line a second), always when it
        answered with an error."""
        kind = db_error_kind(exc)
        self._metrics.db_error("scheduler", kind)
        self._problem = f"scheduler: pass failed ({kind}): {exc or type(exc).__name__}"
        if not is_unreachable(exc):
            log.warning("scheduler pass failed (%s): %s", kind, exc or type(exc).__name__)
            return
        if self._outage is None:
            self._outage = (time.monotonic(), 0)
            log.warning(
                "scheduler pass failed (%s): %s; retrying every %gs, quietly until the "
                "database answers",
                kind, exc or type(exc).__name__, _ERROR_BACKOFF_S,
            )  # fmt: skip
            return
        self._outage = (self._outage[0], self._outage[1] + 1)
        log.debug("scheduler pass failed (%s): %s", kind, exc or type(exc).__name__)

    def _answered(self) -> None:
        """A pass went through: an outage logged is over; say how long it lasted. A
        pass with nothing to do (paused, no schedules) proves nothing: it asked nobody."""
        if self._outage is None or self._paused.is_set() or not self._config.schedules:
            return
        began, quiet = self._outage
        self._outage = None
        log.info(
            "scheduler: the database answers again after %.0fs (%d more failed passes "
            "not logged)",
            time.monotonic() - began, quiet,
        )  # fmt: skip

    async def run_once(self) -> float:
        """One pass; returns how long to sleep before the next."""
        schedules = self._config.schedules
        if not schedules or self._paused.is_set():
            await self._resign()
            return _IDLE_S
        store = await self._store.get()
        table = ScheduleTable(store)
        leading = await self._lead(store)
        now = await self._now(store)
        began = time.monotonic()
        rows = await table.rows()
        if leading:
            fired = False
            for schedule in schedules.values():
                fired |= await self._run_schedule(table, schedule, rows.get(schedule.schedule), now)
            if fired or any(s.schedule not in rows for s in schedules.values()):
                rows = await table.rows()
            if now - self._marked_at >= _MARK_INTERVAL_S:
                await table.mark_leader(self.host, int(now * 1000))
                self._marked_at = now
        self._publish(rows, now)
        if not leading:
            return FOLLOW_INTERVAL_S
        return min(LEAD_RECHECK_S, self._until_next(now, time.monotonic() - began))

    async def _now(self, store: TaskStore) -> float:
        """Now in seconds: the injected clock (tests), else the database's own, which
        its leases and due times are read against (the server's on Postgres, so the
        slots do not follow the leader host's clock)."""
        if self._wall_clock is not None:
            return self._wall_clock()
        return await store.database_now_ms() / 1000

    async def _lead(self, store: TaskStore) -> bool:
        namespace = self._config.database.lock_namespace
        if self._lock is not None and self._lock.key != (namespace, SCHEDULER_LOCK_ID):
            await self._resign()
        if self._lock is None:
            self._lock = store.leadership.leader_lock(namespace, SCHEDULER_LOCK_ID)
        try:
            leading = await self._lock.ensure()
        except BaseException:
            self._set_leading(False)
            raise
        self._set_leading(leading)
        return leading

    def _set_leading(self, leading: bool) -> None:
        if leading != self._leading:
            if leading:
                log.info("scheduler: this host (%s) now runs the schedules", self.host)
            elif self._leading:
                log.info("scheduler: this host no longer runs the schedules")
        self._leading = leading
        self._metrics.schedules.leader.set(1 if leading else 0)

    async def _resign(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            await lock.close()
        if self._leading:
            log.info("scheduler: handing the schedules over")
        self._leading = False
        self._metrics.schedules.leader.set(0)

    # -- one schedule -------------------------------------------------------------------

    async def _run_schedule(
        self, table: ScheduleTable, schedule: ScheduleConfig, row: ScheduleRow | None, now: float
    ) -> bool:
        """Apply the plan of one schedule; True if it enqueued anything."""
        name, now_ms = schedule.schedule, int(now * 1000)
        rule = rule_of(schedule)
        last_ms = row.last_slot_ms if row is not None else now_ms
        unseen = row is None or row.rule != rule
        # A new or changed rule starts after now (ensure says whether this pass changed it).
        if unseen and (await table.ensure(name, rule, now_ms) or row is None):
            last_ms = max(last_ms, now_ms)
            log.info("schedule %s: %s, from the next slot", name, rule)
        if not schedule.enabled:
            return False
        moment = datetime.fromtimestamp(now, UTC)
        plan = plan_due(schedule.slots(), from_ms(last_ms), moment, schedule.misfire)
        if plan.skip_through is not None:
            through = slot_ms(plan.skip_through)
            if await table.skip(name, through, plan.skipped, now_ms):
                self._metrics.schedules.count(self._metrics.schedules.misfires, name, plan.skipped)
                log.warning(
                    "schedule %s: %d missed slot(s) through %s given up (misfire: %s)",
                    name, plan.skipped, _iso(plan.skip_through), schedule.misfire.describe(),
                )  # fmt: skip
        fired = False
        for index, slot in enumerate(plan.fire):
            late = index < plan.late
            if not await self._fire(table, schedule, slot, now_ms, late=late):
                break  # later slots wait behind a failed one
            fired = True
        return fired

    async def _fire(
        self,
        table: ScheduleTable,
        schedule: ScheduleConfig,
        slot: datetime,
        now_ms: int,
        *,
        late: bool,
    ) -> bool:
        """Enqueue one slot; False when that failed (counted, recorded, logged once)."""
        name = schedule.schedule
        try:
            request = slot_request(schedule, slot, now_ms)
            task = await table.fire(name, slot_ms(slot), request, host=self.host, at_ms=now_ms)
        except Exception as exc:
            self._metrics.schedules.count(self._metrics.schedules.enqueue_failures, name)
            message = f"{type(exc).__name__}: {exc}"
            if self._failures.get(name) != message:
                log.warning("schedule %s: enqueuing slot %s failed: %s", name, _iso(slot), message)
            self._failures[name] = message
            with contextlib.suppress(Exception):  # best effort: the database may be the cause
                await table.record_failure(name, message, now_ms)
            return False
        self._failures.pop(name, None)
        if task is None:
            return True  # already enqueued by another host or an earlier pass
        self._metrics.schedules.count(self._metrics.schedules.fired, name)
        when = "late (misfire policy)" if late else "due"
        log.info("schedule %s: slot %s %s: task %s", name, _iso(slot), when, task.id)
        return True

    # -- metrics --------------------------------------------------------------------------

    def _publish(self, rows: dict[str, ScheduleRow], now: float) -> None:
        moment = datetime.fromtimestamp(now, UTC)
        for name, schedule in self._config.schedules.items():
            first_seen = self._first_seen.setdefault(name, now)
            row = rows.get(name)
            fired_ms = row.last_fired_at_ms if row is not None else None
            last_fire = fired_ms / 1000 if fired_ms is not None else first_seen
            next_fire = period = None
            if schedule.enabled:
                slots = schedule.slots()
                start = max(moment, from_ms(row.last_slot_ms)) if row is not None else moment
                next_fire = slots.next_after(start).timestamp()
                period = slots.period(moment).total_seconds()
            self._metrics.schedules.set_times(name, last_fire, next_fire, period)

    def _until_next(self, now: float, elapsed: float) -> float:
        """How long to sleep after a pass that planned for `now` and took `elapsed`: until
        the first slot after `now`, the one that pass could not see yet. Counted from
        `now` plus `elapsed`, but never from a slot past: a pass that ends after that
        slot has the next pass come at once, while the slot is on time (one timed from
        the pass's end slept to the slot after, and a 1 s rule's slot was then past its
        grace)."""
        moment = datetime.fromtimestamp(now, UTC)
        due = [
            schedule.slots().next_after(moment).timestamp()
            for schedule in self._config.schedules.values()
            if schedule.enabled
        ]
        if not due:
            return LEAD_RECHECK_S
        # A few ms past the slot, so the pass that wakes finds it due.
        return max(0.01, min(due) - (now + elapsed) + 0.005)

    async def aclose(self) -> None:
        """Give the lead up and close the store (done by `stop()`)."""
        with contextlib.suppress(Exception):
            await self._resign()
        with contextlib.suppress(Exception):
            await self._store.close()
