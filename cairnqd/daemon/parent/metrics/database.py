"""The database gauges: a custom collector that reads `stats` from the store.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from cairnqd.daemon.parent.dbthread import LoopThread
from cairnqd.daemon.parent.metrics.labels import QueueLabels
from cairnqd.limits import Limit, overridden
from cairnqd.models import STATUSES
from cairnqd.store.base import TaskStore
from cairnqd.store.lazy import LazyStore
from cairnqd.store.leadership import LeaderLock
from cairnqd.store.tables.fleet import versions
from cairnqd.store.tables.limits import LimitUsage

# One logger for the whole metrics package: one name to filter on.
log = logging.getLogger("cairnqd.metrics")

#: How long a scrape waits for the database's figures, and the server's
#: `statement_timeout` for each of the collector's statements.
DB_QUERY_TIMEOUT_S = 2.0
#: Each statement's own deadline: past the server's timeout, so a slow statement on a
#: server that works ends with the server's clean error; with no answer by then, its
#: connection is shut and the statement fails at once. Cancelling it instead (a
#: timeout around the refresh) had psycopg send a cancel request through the same
#: partition first, and the refresh, which scrapes share, ended 10 s later.
DB_CALL_TIMEOUT_S = DB_QUERY_TIMEOUT_S + 0.5
#: A refresh as a whole, a last resort: each of its statements has its deadline.
REFRESH_BOUND_S = 30.0
#: Second key of the stats leader's advisory lock; the purge sweep uses 1 (maintenance.py).
STATS_LOCK_ID = 2
#: `database.lock_namespace`'s default, for collectors built without a config.
DEFAULT_LOCK_NAMESPACE = 0x63716E64


_TASKS_HELP = (
    "Tasks per queue and status (protocol stats; cached up to stats_ttl). running counts "
    "every claimed task, held (prefetched, not started) ones included; "
    "cairnq_child_tasks{state} splits this host's into executing and held. queued leaves "
    "out the tasks waiting for their dependencies (cairnq_tasks_waiting)."
)
_WAITING_HELP = (
    "Queued tasks waiting for the tasks they were submitted after to succeed: not due, "
    "so not a backlog (docs/workflows.md)."
)
_PAUSED_HELP = "1 while the queue is paused (cairnqd pause --queue); 0 otherwise."
_FLEET_HELP = "Daemons live on the database, by version (cairnqd fleet); several: mid-upgrade."
_LIMIT_IN_USE_HELP = (
    "Tasks running under a concurrency limit, every partition and host together (cairnqd limits)."
)
_LIMIT_CAPACITY_HELP = (
    "A concurrency limit's value, per partition when partitioned, as kept now (an "
    "operator's limits set included)."
)
_LIMIT_WAITING_HELP = "Due tasks a limit covers that wait to be claimed (every partition)."
_LIMIT_BYPASSED_HELP = (
    "Running tasks a concurrency limit covers that do not count in it: claimed by a "
    "worker that does not keep the limit (a public SDK worker); counted up to 100."
)
_OLDEST_HELP = "Age of the oldest claimable queued task, database clock; 0 if none."
_EXPIRED_HELP = "Running tasks whose lease expired and that await recovery."
_UP_HELP = (
    "1 if the last statistics query succeeded and no process of the daemon reports the "
    "database unreachable."
)
_DURATION_HELP = "Duration of the last statistics query."
_ERRORS_HELP = "Statistics queries that failed or timed out."


@dataclass(frozen=True)
class DatabaseSnapshot:
    """One refresh of the database gauges, by raw queue name."""

    tasks: Mapping[str, Mapping[str, int]]
    oldest_queued_age_ms: Mapping[str, int]
    leases_expired: Mapping[str, int]
    #: Queues paused with `cairnqd pause`.
    paused: frozenset[str] = frozenset()
    #: Live daemons on the database by version (the fleet registry).
    fleet: Mapping[str, int] = field(default_factory=dict)
    #: What each configured limit holds now (cairnqd limits).
    limits: tuple[LimitUsage, ...] = ()
    #: Running tasks outside each limit (claimed by workers that do not keep it).
    bypassed: Mapping[str, int] = field(default_factory=dict)
    #: Queued tasks waiting for their dependencies, a part of `tasks`' queued.
    waiting: Mapping[str, int] = field(default_factory=dict)
    #: False on a `queue_stats: leader` host that is not the leader: the refresh
    #: succeeded, but the per-queue families are left to the leader.
    exported: bool = True


_NOT_LEADER = DatabaseSnapshot(tasks={}, oldest_queued_age_ms={}, leases_expired={}, exported=False)


async def _query_snapshot(store: TaskStore, limits: tuple[Limit, ...] = ()) -> DatabaseSnapshot:
    usage: tuple[LimitUsage, ...] = ()
    bypassed: dict[str, int] = {}
    if limits:
        table = store.limit_table
        kept = overridden(limits, await table.overrides())
        usage = tuple(await table.usage(kept))
        for bypass in await table.bypassing(kept, most=100, running_only=True):
            bypassed[bypass.limit] = bypassed.get(bypass.limit, 0) + 1
    return DatabaseSnapshot(
        limits=usage,
        bypassed=bypassed,
        tasks=await store.stats(),
        oldest_queued_age_ms=await store.oldest_queued_age_ms(),
        leases_expired=await store.expired_leases(),
        paused=frozenset(p.queue for p in await store.pauses.all()),
        fleet=versions(await store.fleet.live()),
        waiting=await store.waiting_counts(),
    )


@dataclass
class _Refresh:
    started: float
    future: concurrent.futures.Future[DatabaseSnapshot] | None = None
    error_counted: bool = False


class DatabaseCollector:
    """`cairnq_tasks`, oldest-queued age and expired leases, plus the query's health.

    Scrapes run on the HTTP server's threads; the query runs on this collector's own
    thread and store. See the module docstring for the caching and failure rules.
    """

    def __init__(
        self,
        store_factory: Callable[[], TaskStore],
        *,
        queue_labels: QueueLabels,
        ttl_s: float,
        timeout_s: float = DB_QUERY_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        queue_stats: str = "all",
        lock_namespace: int = DEFAULT_LOCK_NAMESPACE,
    ) -> None:
        self._store = LazyStore(store_factory)
        # Read on the collector's loop, replaced whole from the supervisor's thread.
        self._queue_stats = queue_stats
        self._lock_namespace = lock_namespace
        self._limits: tuple[Limit, ...] = ()
        self._leader_lock: LeaderLock | None = None
        self._leading: bool | None = None  # for logging changes only
        self._labels = queue_labels
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._thread = LoopThread("cairnqd-metrics-db")
        self._lock = threading.Lock()
        self._snapshot: DatabaseSnapshot | None = None
        self._fetched_at: float | None = None
        self._inflight: _Refresh | None = None
        self._up = False
        self._duration_s = 0.0
        self._errors = 0
        self._last_error = ""
        self._failing = False  # logged once per streak of failed queries
        self._unreachable: Callable[[], int] = lambda: 0
        self._closed = False
        #: Statistics queries started; tests count them to prove the cache works.
        self.queries = 0

    def set_limits(self, limits: tuple[Limit, ...]) -> None:
        """The config's flow-control limits, whose gauges the next refresh reads."""
        self._limits = limits

    def set_ttl(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s

    def set_queue_stats(self, queue_stats: str, lock_namespace: int) -> None:
        """`metrics.queue_stats` (all, leader) and the lock's namespace; the next
        refresh takes, keeps or gives up the lock accordingly."""
        self._queue_stats, self._lock_namespace = queue_stats, lock_namespace

    def set_outage_source(self, unreachable: Callable[[], int]) -> None:
        """How many of the daemon's processes cannot reach the database now (called
        from scrape threads)."""
        self._unreachable = unreachable

    def problem(self) -> str | None:
        """Why the last statistics query failed, if it did (None before the first)."""
        with self._lock:
            stale = not self._up and self._inflight is None and not self._is_fresh()
            if stale and not self._closed:
                # Asked again after the cached failure ran out: check again in the
                # background, so /healthz recovers without waiting for a scrape.
                self._start_refresh()
            if self._up or not self._errors:
                return None
            return f"database statistics query failed: {self._last_error or 'timed out'}"

    @property
    def leading(self) -> bool | None:
        """Whether the last refresh found this collector the leader (None: not yet)."""
        return self._leading

    # -- prometheus_client collector protocol ----------------------------------------------

    def describe(self) -> Iterable[Metric]:
        return [*self._status_families(), *self._db_families(None)]

    def collect(self) -> Iterable[Metric]:
        snapshot = self._current()
        families = self._status_families()
        if snapshot is not None and snapshot.exported:
            families.extend(self._db_families(snapshot))
        return families

    # -- one query shared by concurrent scrapes ------------------------------------------

    def _current(self) -> DatabaseSnapshot | None:
        with self._lock:
            if self._closed:
                return None
            if self._inflight is None and self._is_fresh():
                return self._snapshot
            refresh = self._inflight or self._start_refresh()
        assert refresh.future is not None
        try:
            return refresh.future.result(timeout=self._timeout_s)
        except TimeoutError:
            self._timed_out(refresh)
        except Exception:
            pass  # recorded (and logged) by the refresh itself
        return None

    def _is_fresh(self) -> bool:
        fetched = self._fetched_at
        return fetched is not None and self._clock() - fetched < self._ttl_s

    def _start_refresh(self) -> _Refresh:
        # Called with the lock held; the refresh's own bookkeeping waits for it.
        self._thread.start()
        refresh = _Refresh(started=self._clock())
        refresh.future = self._thread.submit(self._refresh(refresh))
        self._inflight = refresh
        self.queries += 1
        return refresh

    def _timed_out(self, refresh: _Refresh) -> None:
        with self._lock:
            if not refresh.error_counted:
                refresh.error_counted = True
                self._errors += 1
                level = logging.DEBUG if self._failing else logging.WARNING
                log.log(level, "database statistics query exceeded %.1fs", self._timeout_s)
            self._up = False
            self._duration_s = self._clock() - refresh.started

    async def _refresh(self, refresh: _Refresh) -> DatabaseSnapshot:
        try:
            store = await self._store.get()
            # Connecting has its own timeout (connect_timeout), each statement its own
            # deadline (DB_CALL_TIMEOUT_S); scrapes stop waiting at 2 s regardless, and
            # share this refresh until it ends.
            snapshot = await asyncio.wait_for(self._query(store), REFRESH_BOUND_S)
        except Exception as exc:
            self._last_error = str(exc) or type(exc).__name__
            self._finish(refresh, None)
            # Once per streak: a scrape every few seconds during an outage would
            # otherwise log the same failure each time.
            level = logging.DEBUG if self._failing else logging.WARNING
            self._failing = True
            log.log(level, "database statistics query failed: %s", self._last_error)
            raise
        if self._failing:
            self._failing = False
            log.info("database statistics query works again")
        self._finish(refresh, snapshot)
        return snapshot

    async def _query(self, store: TaskStore) -> DatabaseSnapshot:
        if not await self._leads(store):
            return _NOT_LEADER
        return await _query_snapshot(store, self._limits)

    async def _leads(self, store: TaskStore) -> bool:
        """Whether this host exports the per-queue families; with `leader` on Postgres,
        checks or takes the leader lock on its own session."""
        mode, key = self._queue_stats, (self._lock_namespace, STATS_LOCK_ID)
        lock = self._leader_lock
        if lock is not None and (mode != "leader" or lock.key != key):
            # Reloaded away from `leader` (or to another namespace): end the session
            # now, so another host need not wait for our restart to take over.
            self._leader_lock = None
            await lock.close()
        if mode != "leader":
            return True
        if self._leader_lock is None:
            # On SQLite, where this host is the only one, the lock is always held.
            self._leader_lock = store.leadership.leader_lock(*key)
        try:
            leading = await self._leader_lock.ensure()
        except BaseException:
            self._leading = None  # unknown; the failed refresh is logged by the caller
            raise
        if leading != self._leading:
            if leading:
                log.info("stats leader: this host now exports the per-queue gauges")
            else:
                log.info("not the stats leader: another host exports the per-queue gauges")
        self._leading = leading
        return leading

    def _finish(self, refresh: _Refresh, snapshot: DatabaseSnapshot | None) -> None:
        with self._lock:
            now = self._clock()
            # A failure is cached too: a struggling database is asked once per ttl.
            self._snapshot, self._fetched_at = snapshot, now
            self._up = snapshot is not None
            self._duration_s = now - refresh.started
            if snapshot is None and not refresh.error_counted:
                refresh.error_counted = True
                self._errors += 1
            if self._inflight is refresh:
                self._inflight = None

    def close(self, timeout_s: float = 5.0) -> None:
        """Close the store on its own thread, then end the thread. Idempotent. A
        refresh stuck on a silent database is cut short after half of `timeout_s`
        (`LoopThread.cut_short`), as the scheduler's and maintenance's calls are."""
        with self._lock:
            self._closed = True
        if not self._thread.running():
            return
        deadline = time.monotonic() + timeout_s
        closing = self._thread.submit(self._close_store())
        self._thread.finish_or_cut(
            closing, timeout_s / 2, self._sever, "the database statistics collector", log
        )
        self._thread.stop(deadline - time.monotonic())

    def _sever(self) -> None:
        """Cut the store's calls and the leader lock's session short (on the loop)."""
        self._store.sever()
        if self._leader_lock is not None:
            self._leader_lock.sever()

    async def _close_store(self) -> None:
        lock, self._leader_lock = self._leader_lock, None
        try:
            if lock is not None:
                await lock.close()  # hand leadership over at once, not at the process's end
            await self._store.close()
        except Exception:  # a broken connection may fail to close: it is gone anyway
            log.debug("closing the statistics store failed", exc_info=True)

    # -- families --------------------------------------------------------------------------

    def _status_families(self) -> list[Metric]:
        with self._lock:
            up, duration, errors = self._up, self._duration_s, self._errors
        try:
            unreachable = self._unreachable()
        except Exception:  # a scrape must not fail on the supervisor's bookkeeping
            log.exception("counting the processes that cannot reach the database failed")
            unreachable = 0
        up = up and not unreachable
        return [
            GaugeMetricFamily("cairnq_db_up", _UP_HELP, value=1.0 if up else 0.0),
            GaugeMetricFamily("cairnq_db_scrape_duration_seconds", _DURATION_HELP, value=duration),
            CounterMetricFamily("cairnq_db_scrape_errors", _ERRORS_HELP, value=errors),
        ]

    def _db_families(self, snapshot: DatabaseSnapshot | None) -> list[Metric]:
        tasks = GaugeMetricFamily("cairnq_tasks", _TASKS_HELP, labels=["queue", "status"])
        waiting = GaugeMetricFamily("cairnq_tasks_waiting", _WAITING_HELP, labels=["queue"])
        oldest = GaugeMetricFamily(
            "cairnq_queue_oldest_queued_age_seconds", _OLDEST_HELP, labels=["queue"]
        )
        expired = GaugeMetricFamily("cairnq_leases_expired", _EXPIRED_HELP, labels=["queue"])
        paused = GaugeMetricFamily("cairnq_queue_paused", _PAUSED_HELP, labels=["queue"])
        fleet = GaugeMetricFamily("cairnq_fleet_daemons", _FLEET_HELP, labels=["version"])
        limits = _limit_families()
        if snapshot is not None:
            self._fill(snapshot, tasks, oldest, expired, waiting)
            self._fill_paused(snapshot, paused)
            for version, count in snapshot.fleet.items():
                fleet.add_metric([version], float(count))
            _fill_limits(snapshot.limits, snapshot.bypassed, *limits)
        return [tasks, waiting, oldest, expired, paused, fleet, *limits]

    def _fill_paused(self, snapshot: DatabaseSnapshot, paused: GaugeMetricFamily) -> None:
        # Configured queues show 0 when running, so an alert can tell "not paused"
        # from "not exported"; a paused queue no group serves shows too.
        label = self._labels.labels(snapshot.paused)
        shown = sorted(self._labels.configured | set(label.values()))
        on = {label[q] for q in snapshot.paused}
        for queue in shown:
            paused.add_metric([queue], 1.0 if queue in on else 0.0)

    def _fill(
        self,
        snapshot: DatabaseSnapshot,
        tasks: GaugeMetricFamily,
        oldest: GaugeMetricFamily,
        expired: GaugeMetricFamily,
        waiting: GaugeMetricFamily,
    ) -> None:
        queues = (
            set(snapshot.tasks) | set(snapshot.oldest_queued_age_ms) | set(snapshot.leases_expired)
        )
        label = self._labels.labels(queues)
        # Configured queues always show, at 0 when empty: absent is not zero to an alert.
        shown = sorted(self._labels.configured | set(label.values()))
        counts: dict[str, dict[str, int]] = {q: dict.fromkeys(STATUSES, 0) for q in shown}
        ages_ms = dict.fromkeys(shown, 0)
        leases = dict.fromkeys(shown, 0)
        held = dict.fromkeys(shown, 0)
        for queue, by_status in snapshot.tasks.items():
            for status, n in by_status.items():
                counts[label[queue]][status] = counts[label[queue]].get(status, 0) + n
        # A task waiting for its dependencies is queued, but not a backlog: apart.
        for queue, n in snapshot.waiting.items():
            if queue in label:
                held[label[queue]] += n
                # Read after stats: never below zero when more began waiting since.
                queued = counts[label[queue]]
                queued["queued"] = max(0, queued["queued"] - n)
        for queue, age_ms in snapshot.oldest_queued_age_ms.items():
            ages_ms[label[queue]] = max(ages_ms[label[queue]], age_ms)
        for queue, n in snapshot.leases_expired.items():
            leases[label[queue]] += n
        for queue in shown:
            for status, n in counts[queue].items():
                tasks.add_metric([queue, status], n)
            oldest.add_metric([queue], ages_ms[queue] / 1000)
            expired.add_metric([queue], leases[queue])
            waiting.add_metric([queue], held[queue])


def _limit_families() -> list[GaugeMetricFamily]:
    # Labelled by limit only: partitions (one per tenant, say) would be unbounded series.
    return [
        GaugeMetricFamily(name, text, labels=["limit"])
        for name, text in (
            ("cairnq_limit_in_use", _LIMIT_IN_USE_HELP),
            ("cairnq_limit_capacity", _LIMIT_CAPACITY_HELP),
            ("cairnq_limit_waiting", _LIMIT_WAITING_HELP),
            ("cairnq_limit_bypassed", _LIMIT_BYPASSED_HELP),
        )
    ]


def _fill_limits(
    usages: Iterable[LimitUsage],
    bypassed: Mapping[str, int],
    in_use: GaugeMetricFamily,
    capacity: GaugeMetricFamily,
    waiting: GaugeMetricFamily,
    outside: GaugeMetricFamily,
) -> None:
    for usage in usages:
        name = usage.limit.name
        if usage.limit.concurrency is not None:
            in_use.add_metric([name], float(usage.in_use))
            capacity.add_metric([name], float(usage.limit.concurrency))
            outside.add_metric([name], float(bypassed.get(name, 0)))
        waiting.add_metric([name], float(usage.waiting))
