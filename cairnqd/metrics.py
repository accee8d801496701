"""The parent's Prometheus registry, its HTTP endpoint and the database collector.

Design note (DAEMON.md §6). The parent owns the only registry; children report on their
event pipe and `record_event` turns each line into counter updates here, so counters
survive child restarts and no multiprocess mode (with its per-pid files) is needed.

- **DB gauges** come from `DatabaseCollector`, a custom collector with its own thread,
  asyncio loop and store (opened in that thread on first use; never in a scrape thread,
  never on the supervisor's loop). Results are reused for `stats_ttl`; concurrent
  scrapes share the one query in flight; a scrape waits at most 2 s. On failure the DB
  families are left out (no stale numbers) and `cairnq_db_up` is 0. `describe()`
  answers without a query, so registering never touches the database.
- **`metrics.queue_stats: leader`** (Postgres): only the host whose collector holds
  the session advisory lock `(database.lock_namespace, 2)` exports `cairnq_tasks`,
  the oldest-queued age and expired leases, so dashboards can `sum` without
  double-counting and the database answers the statistics once, not once per host.
  The lock lives on a session of the collector's own, taken with
  `pg_try_advisory_lock` and kept while that session lives; a non-leader tries again
  on each refresh, so when the leader stops or loses its connection another host
  takes over within one `stats_ttl`. Non-leaders run no statistics query but still
  export `cairnq_db_up` (did the lock's round trip succeed) and the scrape gauges.
  SQLite has one host, which always leads.
- **Cardinality.** Label values come from config or fixed enums. Queues this host does
  not configure keep their name for the first 20 seen; the rest are summed as
  `queue="_other"`. Known combinations start at 0; a dropped queue, group or rule has
  its series removed on reload.
- `disable_created_metrics()` drops the `_created` series (process-wide, which is what
  the daemon wants).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import platform
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIEnvironment

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from . import __version__
from .config import Config, MetricsConfig
from .maintenance import LoopThread, parent_store
from .models import STATUSES
from .store.base import TaskStore
from .store.postgres import HeldSessionLock, PostgresStore

__all__ = [
    "CHILD_STATES",
    "DB_ERROR_KINDS",
    "FAILURE_REASONS",
    "GROUP_STATES",
    "METRIC_NAMES",
    "OTHER_QUEUE",
    "RECOVERY_REASONS",
    "RESTART_REASONS",
    "DatabaseCollector",
    "DatabaseSnapshot",
    "Metrics",
    "QueueLabels",
]

log = logging.getLogger("cairnqd.metrics")

OTHER_QUEUE = "_other"
#: Unconfigured queues that keep their own label value before `_other` takes over.
MAX_UNKNOWN_QUEUES = 20
DB_QUERY_TIMEOUT_S = 2.0
#: Second key of the stats leader's advisory lock; the purge sweep uses 1 (DAEMON.md §5).
STATS_LOCK_ID = 2
#: `database.lock_namespace`'s default, for collectors built without a config.
DEFAULT_LOCK_NAMESPACE = 0x63716E64

FAILURE_REASONS = ("error", "max_run", "worker_lost", "lease_lost")
RECOVERY_REASONS = ("expired", "worker_exit", "shutdown", "max_run")
CHILD_STATES = ("starting", "ready", "draining", "backoff")
GROUP_STATES = ("running", "crashloop", "fatal")
RESTART_REASONS = (
    "crash",
    "signal",
    "heartbeat_timeout",
    "boot_failure",
    "max_run",
    "max_tasks",
    "max_memory",
    "reload",
)
DB_ERROR_COMPONENTS = ("child", "maintenance", "listener")
DB_ERROR_KINDS = ("busy", "timeout", "connect", "other")

#: Every family DAEMON.md §6 defines, as a scrape exposes it (counters with `_total`).
#: monitoring/ and its tests are held to this list.
METRIC_NAMES: tuple[str, ...] = (
    "cairnq_tasks",
    "cairnq_queue_oldest_queued_age_seconds",
    "cairnq_leases_expired",
    "cairnq_db_up",
    "cairnq_db_scrape_duration_seconds",
    "cairnq_db_scrape_errors_total",
    "cairnq_db_errors_total",
    "cairnq_tasks_started_total",
    "cairnq_tasks_succeeded_total",
    "cairnq_tasks_failed_total",
    "cairnq_tasks_retried_total",
    "cairnq_tasks_canceled_total",
    "cairnq_task_duration_seconds",
    "cairnq_task_queue_wait_seconds",
    "cairnq_lease_recoveries_total",
    "cairnq_children",
    "cairnq_children_desired",
    "cairnq_child_restarts_total",
    "cairnq_group_state",
    "cairnq_child_resident_memory_bytes",
    "cairnq_purge_deleted_total",
    "cairnq_purge_runs_total",
    "cairnq_purge_failures_total",
    "cairnq_purge_last_success_timestamp_seconds",
    "cairnq_config_last_reload_successful",
    "cairnq_config_last_reload_success_timestamp_seconds",
    "cairnq_config_generation",
    "cairnq_build_info",
)

_TASKS_HELP = "Tasks per queue and status (protocol stats; cached up to stats_ttl)."
_OLDEST_HELP = "Age of the oldest claimable queued task, database clock; 0 if none."
_EXPIRED_HELP = "Running tasks whose lease expired and that await recovery."
_UP_HELP = "1 if the last statistics query succeeded."
_DURATION_HELP = "Duration of the last statistics query."
_ERRORS_HELP = "Statistics queries that failed or timed out."


# -- queue label values ----------------------------------------------------------------------


class QueueLabels:
    """The `queue` label value for a queue name, bounded (thread-safe).

    Configured queues pass through. Others keep their name for the first
    `MAX_UNKNOWN_QUEUES` seen (sorted within one batch, so a scrape is deterministic);
    every later one is `_other`. Admission is sticky, so a series never changes label.
    """

    def __init__(self, configured: Iterable[str], limit: int = MAX_UNKNOWN_QUEUES) -> None:
        self._configured = frozenset(configured)
        self._admitted: set[str] = set()
        self._limit = limit
        self._lock = threading.Lock()

    @property
    def configured(self) -> frozenset[str]:
        return self._configured

    def configure(self, configured: Iterable[str]) -> None:
        with self._lock:
            self._configured = frozenset(configured)

    def label(self, queue: str) -> str:
        if queue in self._configured or queue in self._admitted:
            return queue  # the common case, without the lock
        return self.labels([queue])[queue]

    def labels(self, queues: Iterable[str]) -> dict[str, str]:
        with self._lock:
            unknown = sorted(set(queues) - self._configured - self._admitted)
            room = max(0, self._limit - len(self._admitted))
            self._admitted.update(unknown[:room])
            known = self._configured | self._admitted
        return {q: q if q in known else OTHER_QUEUE for q in queues}


def _configured_queues(config: Config) -> list[str]:
    return sorted({q for group in config.groups.values() for q in group.queues})


# -- the database collector ----------------------------------------------------------------------


@dataclass(frozen=True)
class DatabaseSnapshot:
    """One refresh of the database gauges, by raw queue name."""

    tasks: Mapping[str, Mapping[str, int]]
    oldest_queued_age_ms: Mapping[str, int]
    leases_expired: Mapping[str, int]
    #: False on a `queue_stats: leader` host that is not the leader: the refresh
    #: succeeded, but the per-queue families are left to the leader.
    exported: bool = True


_NOT_LEADER = DatabaseSnapshot(tasks={}, oldest_queued_age_ms={}, leases_expired={}, exported=False)


async def _query_snapshot(store: TaskStore) -> DatabaseSnapshot:
    return DatabaseSnapshot(
        tasks=await store.stats(),
        oldest_queued_age_ms=await store.oldest_queued_age_ms(),
        leases_expired=await store.expired_leases(),
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
        self._store_factory = store_factory
        # Read on the collector's loop, replaced whole from the supervisor's thread.
        self._queue_stats = queue_stats
        self._lock_namespace = lock_namespace
        self._leader_lock: HeldSessionLock | None = None
        self._leading: bool | None = None  # for logging changes only
        self._labels = queue_labels
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._thread = LoopThread("cairnqd-metrics-db")
        self._store: TaskStore | None = None
        self._store_connected = False
        self._lock = threading.Lock()
        self._snapshot: DatabaseSnapshot | None = None
        self._fetched_at: float | None = None
        self._inflight: _Refresh | None = None
        self._up = False
        self._duration_s = 0.0
        self._errors = 0
        self._closed = False
        #: Statistics queries started; tests count them to prove the cache works.
        self.queries = 0

    def set_ttl(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s

    def set_queue_stats(self, queue_stats: str, lock_namespace: int) -> None:
        """`metrics.queue_stats` (all, leader) and the lock's namespace; the next
        refresh takes, keeps or gives up the lock accordingly."""
        self._queue_stats, self._lock_namespace = queue_stats, lock_namespace

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
                log.warning("database statistics query exceeded %.1fs", self._timeout_s)
            self._up = False
            self._duration_s = self._clock() - refresh.started

    async def _refresh(self, refresh: _Refresh) -> DatabaseSnapshot:
        try:
            store = await self._connected_store()
            # Connecting has its own timeout (connect_timeout); scrapes stop waiting at
            # 2 s regardless, and share this refresh until it ends.
            snapshot = await asyncio.wait_for(self._query(store), self._timeout_s)
        except Exception as exc:
            self._finish(refresh, None)
            log.warning("database statistics query failed: %s", exc or type(exc).__name__)
            raise
        self._finish(refresh, snapshot)
        return snapshot

    async def _query(self, store: TaskStore) -> DatabaseSnapshot:
        if not await self._leads(store):
            return _NOT_LEADER
        return await _query_snapshot(store)

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
        if mode != "leader" or not isinstance(store, PostgresStore):
            return True  # `all`, or SQLite, where this host is the only one
        if self._leader_lock is None:
            self._leader_lock = store.held_session_lock(*key)
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

    async def _connected_store(self) -> TaskStore:
        if self._store is None:
            self._store = self._store_factory()
        if not self._store_connected:
            await self._store.connect()
            self._store_connected = True
        return self._store

    def close(self, timeout_s: float = 5.0) -> None:
        """Close the store on its own thread, then end the thread. Idempotent."""
        with self._lock:
            self._closed = True
        if not self._thread.running():
            return
        with contextlib.suppress(Exception):
            self._thread.submit(self._close_store()).result(timeout=timeout_s)
        self._thread.stop(timeout_s)

    async def _close_store(self) -> None:
        lock, self._leader_lock = self._leader_lock, None
        if lock is not None:
            await lock.close()  # hand leadership over at once, not when the process ends
        store, self._store = self._store, None
        self._store_connected = False
        if store is not None:
            await store.close()

    # -- families --------------------------------------------------------------------------

    def _status_families(self) -> list[Metric]:
        with self._lock:
            up, duration, errors = self._up, self._duration_s, self._errors
        return [
            GaugeMetricFamily("cairnq_db_up", _UP_HELP, value=1.0 if up else 0.0),
            GaugeMetricFamily("cairnq_db_scrape_duration_seconds", _DURATION_HELP, value=duration),
            CounterMetricFamily("cairnq_db_scrape_errors", _ERRORS_HELP, value=errors),
        ]

    def _db_families(self, snapshot: DatabaseSnapshot | None) -> list[Metric]:
        tasks = GaugeMetricFamily("cairnq_tasks", _TASKS_HELP, labels=["queue", "status"])
        oldest = GaugeMetricFamily(
            "cairnq_queue_oldest_queued_age_seconds", _OLDEST_HELP, labels=["queue"]
        )
        expired = GaugeMetricFamily("cairnq_leases_expired", _EXPIRED_HELP, labels=["queue"])
        if snapshot is not None:
            self._fill(snapshot, tasks, oldest, expired)
        return [tasks, oldest, expired]

    def _fill(
        self,
        snapshot: DatabaseSnapshot,
        tasks: GaugeMetricFamily,
        oldest: GaugeMetricFamily,
        expired: GaugeMetricFamily,
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
        for queue, by_status in snapshot.tasks.items():
            for status, n in by_status.items():
                counts[label[queue]][status] = counts[label[queue]].get(status, 0) + n
        for queue, age_ms in snapshot.oldest_queued_age_ms.items():
            ages_ms[label[queue]] = max(ages_ms[label[queue]], age_ms)
        for queue, n in snapshot.leases_expired.items():
            leases[label[queue]] += n
        for queue in shown:
            for status, n in counts[queue].items():
                tasks.add_metric([queue, status], n)
            oldest.add_metric([queue], ages_ms[queue] / 1000)
            expired.add_metric([queue], leases[queue])


# -- the HTTP endpoint ------------------------------------------------------------------------


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line each."""


class _HttpServer:
    """`/metrics` and `/healthz` on a daemon thread; `close()` stops and joins it."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        health: Callable[[], bool],
    ) -> None:
        self._metrics_app = make_wsgi_app(registry)
        self._health = health
        server_class, address = _server_class(host, port)
        self._httpd = make_server(
            address, port, self._app, server_class=server_class, handler_class=_QuietHandler
        )
        self.port: int = self._httpd.server_port
        # serve_forever notices shutdown() once per poll: keep close() quick.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="cairnqd-metrics-http",
            daemon=True,
        )
        self._thread.start()

    def _app(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            body: Iterable[bytes] = self._metrics_app(environ, start_response)
            return body
        if path == "/healthz":
            healthy = self._healthy()
            status = "200 OK" if healthy else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [b"ok\n" if healthy else b"unhealthy\n"]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: try /metrics or /healthz\n"]

    def _healthy(self) -> bool:
        try:
            return bool(self._health())
        except Exception:
            log.exception("health check failed")
            return False

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def _server_class(host: str, port: int) -> tuple[type[WSGIServer], str]:
    # wsgiref binds AF_INET unless told otherwise; pick the family of the address given.
    family, _, _, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    return Server, str(sockaddr[0])


# -- the registry ------------------------------------------------------------------------------


class _SeriesBook:
    """Label values in use per labelled metric, so a dropped queue, group or rule can
    have every series `remove()`d (prometheus_client offers no partial match)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[int, tuple[MetricWrapperBase, tuple[str, ...], set[tuple[str, ...]]]] = {}
        # The labelled child per (metric, values): task events hit the same few series
        # thousands of times a second, and `labels()` re-validates every call.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: MetricWrapperBase, labelnames: Sequence[str], *values: str) -> Any:
        found = self._children.get((id(metric), values))
        if found is not None:
            return found
        with self._lock:
            entry = self._seen.setdefault(id(metric), (metric, tuple(labelnames), set()))
            entry[2].add(values)
            found = self._children[(id(metric), values)] = metric.labels(*values)
        return found

    def forget(self, metric: MetricWrapperBase) -> None:
        with self._lock:
            self._seen.pop(id(metric), None)
            for key in [k for k in self._children if k[0] == id(metric)]:
                del self._children[key]

    def remove(self, metric: MetricWrapperBase, *values: str) -> None:
        """Drop one series (and the cached child that would otherwise outlive it)."""
        with self._lock:
            self._children.pop((id(metric), values), None)
            entry = self._seen.get(id(metric))
            if entry is not None:
                entry[2].discard(values)
            with contextlib.suppress(KeyError):
                metric.remove(*values)

    def remove_where(self, label: str, keep: Callable[[str], bool]) -> None:
        """Remove every series whose `label` value fails `keep`."""
        with self._lock:
            for metric, names, seen in self._seen.values():
                if label not in names:
                    continue
                index = names.index(label)
                for values in [v for v in seen if not keep(v[index])]:
                    seen.discard(values)
                    self._children.pop((id(metric), values), None)
                    with contextlib.suppress(KeyError):
                        metric.remove(*values)


class Metrics:
    """Every §6 family in one registry, and the updates the supervisor makes.

    Updates are thread-safe (the maintenance thread reports recoveries and purges);
    label values are bounded as the module docstring says.
    """

    def __init__(
        self,
        config: Config,
        *,
        store_factory: Callable[[], TaskStore] | None = None,
        generation: int = 1,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream
        self.registry = CollectorRegistry()
        self._config = config
        self._wall_clock = wall_clock
        self._series = _SeriesBook()
        self.queue_labels = QueueLabels(_configured_queues(config))
        self._server: _HttpServer | None = None
        self._build_process_metrics()
        self._build_task_metrics(config.metrics)
        factory = store_factory or (
            lambda: parent_store(
                config.database, statement_timeout_ms=int(DB_QUERY_TIMEOUT_S * 1000)
            )
        )
        self.database = DatabaseCollector(
            factory,
            queue_labels=self.queue_labels,
            ttl_s=config.metrics.stats_ttl.total_seconds(),
            queue_stats=config.metrics.queue_stats,
            lock_namespace=config.database.lock_namespace,
        )
        self.registry.register(self.database)
        self.build_info.labels(
            __version__, "1", platform.python_version(), config.database.backend
        ).set(1)
        # Baseline: a fresh daemon is not "stale"; its first sweep is an interval away.
        self.purge_last_success.set(wall_clock())
        self.reload_result(True, generation)
        self._zero_known(config)

    # -- construction ------------------------------------------------------------------------

    def _build_process_metrics(self) -> None:
        r = self.registry
        self.db_errors = Counter(
            "cairnq_db_errors_total",
            "DB errors survived (child, maintenance, listener x busy, timeout, connect, other).",
            ["component", "kind"],
            registry=r,
        )
        self.lease_recoveries_total = Counter(
            "cairnq_lease_recoveries_total",
            "Tasks returned by this host (expired, worker_exit, shutdown, max_run).",
            ["queue", "reason"],
            registry=r,
        )
        self.children = Gauge(
            "cairnq_children",
            "Children per state (starting, ready, draining, backoff).",
            ["group", "state"],
            registry=r,
        )
        self.children_desired = Gauge(
            "cairnq_children_desired", "Configured pool size.", ["group"], registry=r
        )
        self.child_restarts = Counter(
            "cairnq_child_restarts_total",
            "Children replaced (crash, signal, heartbeat_timeout, boot_failure, max_run, "
            "max_tasks, max_memory, reload).",
            ["group", "reason"],
            registry=r,
        )
        self.group_state = Gauge(
            "cairnq_group_state",
            "1 for the group's current state (running, crashloop, fatal).",
            ["group", "state"],
            registry=r,
        )
        self.child_memory = Gauge(
            "cairnq_child_resident_memory_bytes",
            "Each child's RSS, from its heartbeats.",
            ["group", "slot"],
            registry=r,
        )
        self._build_purge_metrics()
        self._build_config_metrics()

    def _build_purge_metrics(self) -> None:
        r = self.registry
        self.purge_deleted_total = Counter(
            "cairnq_purge_deleted_total",
            "Tasks deleted by the retention purge.",
            ["rule"],
            registry=r,
        )
        self.purge_runs = Counter("cairnq_purge_runs_total", "Purge sweeps started.", registry=r)
        self.purge_failures = Counter(
            "cairnq_purge_failures_total", "Purge sweeps failed.", registry=r
        )
        self.purge_last_success = Gauge(
            "cairnq_purge_last_success_timestamp_seconds",
            "Unix time of the last successful sweep.",
            registry=r,
        )

    def _build_config_metrics(self) -> None:
        r = self.registry
        self.config_reload_successful = Gauge(
            "cairnq_config_last_reload_successful",
            "1 if the last config load succeeded.",
            registry=r,
        )
        self.config_reload_success_time = Gauge(
            "cairnq_config_last_reload_success_timestamp_seconds",
            "Unix time of the last config load that succeeded.",
            registry=r,
        )
        self.config_generation = Gauge(
            "cairnq_config_generation", "Generation of the active config.", registry=r
        )
        self.build_info = Gauge(
            "cairnq_build_info",
            "Build and runtime information (value 1).",
            ["version", "protocol", "python", "backend"],
            registry=r,
        )

    def _build_task_metrics(self, settings: MetricsConfig) -> None:
        """The families whose shape config decides: the optional `name` label, buckets."""
        self._name_label = settings.task_name_label
        self._task_labels = ("queue", "name") if self._name_label else ("queue",)
        self._failed_labels = (
            ("queue", "reason", "name") if self._name_label else ("queue", "reason")
        )
        self._buckets = (settings.duration_buckets, settings.wait_buckets)
        r, labels = self.registry, self._task_labels
        self.tasks_started = Counter(
            "cairnq_tasks_started_total", "Attempts started on this host.", labels, registry=r
        )
        self.tasks_succeeded = Counter(
            "cairnq_tasks_succeeded_total", "Attempts that ended succeeded.", labels, registry=r
        )
        self.tasks_failed = Counter(
            "cairnq_tasks_failed_total",
            "Attempts that failed, retried or not (error, max_run, worker_lost, lease_lost).",
            self._failed_labels,
            registry=r,
        )
        self.tasks_retried = Counter(
            "cairnq_tasks_retried_total",
            "Failed attempts requeued for another attempt (a subset of failed).",
            labels,
            registry=r,
        )
        self.tasks_canceled = Counter(
            "cairnq_tasks_canceled_total", "Attempts that ended canceled.", labels, registry=r
        )
        self.task_duration = Histogram(
            "cairnq_task_duration_seconds",
            "Wall time of task attempts.",
            ["queue"],
            buckets=settings.duration_buckets,
            registry=r,
        )
        self.task_queue_wait = Histogram(
            "cairnq_task_queue_wait_seconds",
            "Time from run_at to claim.",
            ["queue"],
            buckets=settings.wait_buckets,
            registry=r,
        )

    def _task_metrics(self) -> list[MetricWrapperBase]:
        return [
            self.tasks_started,
            self.tasks_succeeded,
            self.tasks_failed,
            self.tasks_retried,
            self.tasks_canceled,
            self.task_duration,
            self.task_queue_wait,
        ]

    def _zero_known(self, config: Config) -> None:
        """Create every combination config makes known, at 0: a rate() over a series
        that appears only on its first increment misses that increment."""
        for component in DB_ERROR_COMPONENTS:
            for kind in DB_ERROR_KINDS:
                self.db_errors.labels(component, kind)
        for queue in self.queue_labels.configured:
            self._zero_queue(queue)
        for name, group in config.groups.items():
            self.set_children_desired(name, group.processes)
            self.set_children(name, {})
            for reason in RESTART_REASONS:
                self._child(self.child_restarts, ("group", "reason"), name, reason)
        for index in range(len(config.retention.rules)):
            self._child(self.purge_deleted_total, ("rule",), str(index))

    def _zero_queue(self, queue: str) -> None:
        for reason in RECOVERY_REASONS:
            self._child(self.lease_recoveries_total, ("queue", "reason"), queue, reason)
        self._child(self.task_duration, ("queue",), queue)
        self._child(self.task_queue_wait, ("queue",), queue)
        if self._name_label:
            return  # names are not known in advance
        for counter in (
            self.tasks_started,
            self.tasks_succeeded,
            self.tasks_retried,
            self.tasks_canceled,
        ):
            self._child(counter, ("queue",), queue)
        for reason in FAILURE_REASONS:
            self._child(self.tasks_failed, ("queue", "reason"), queue, reason)

    def _child(self, metric: MetricWrapperBase, labelnames: Sequence[str], *values: str) -> Any:
        return self._series.child(metric, labelnames, *values)

    # -- reload ---------------------------------------------------------------------------

    def apply_config(self, config: Config) -> None:
        """Parent-hot `metrics.*` and the known combinations after a reload: new queues,
        groups and rules start at 0, dropped ones lose their series."""
        dropped_queues = set(_configured_queues(self._config)) - set(_configured_queues(config))
        self._config = config
        settings = config.metrics
        shape = (settings.task_name_label, (settings.duration_buckets, settings.wait_buckets))
        if shape != (self._name_label, self._buckets):
            # A family's label names and buckets are fixed at creation: replace them.
            for metric in self._task_metrics():
                self.registry.unregister(metric)
                self._series.forget(metric)
            self._build_task_metrics(settings)
        self.queue_labels.configure(_configured_queues(config))
        self.database.set_ttl(settings.stats_ttl.total_seconds())
        self.database.set_queue_stats(settings.queue_stats, config.database.lock_namespace)
        groups = set(config.groups)
        rules = {str(i) for i in range(len(config.retention.rules))}
        self._series.remove_where("queue", lambda queue: queue not in dropped_queues)
        self._series.remove_where("group", lambda group: group in groups)
        self._series.remove_where("rule", lambda rule: rule in rules)
        self._zero_known(config)

    # -- updates from the supervisor --------------------------------------------------------

    def record_event(self, group: str, slot: int, event: Mapping[str, Any]) -> None:
        """Count one decoded pipe message from child `group`/`slot` (`t` names it, as
        pipes.py writes it). Malformed or unknown messages are ignored."""
        kind = event.get("t")
        handler = self._event_handlers.get(str(kind))
        if handler is None:
            return
        try:
            handler(self, group, slot, event)
        except (KeyError, TypeError, ValueError) as exc:
            log.debug("ignoring malformed %s event from %s/%s: %s", kind, group, slot, exc)

    def _on_start(self, group: str, slot: int, event: Mapping[str, Any]) -> None:
        queue = self.queue_labels.label(str(event["queue"]))
        self._task_counter(self.tasks_started, queue, event).inc()
        wait_s = max(0.0, float(event.get("wait_s", 0.0)))
        self._child(self.task_queue_wait, ("queue",), queue).observe(wait_s)

    def _on_end(self, group: str, slot: int, event: Mapping[str, Any]) -> None:
        queue = self.queue_labels.label(str(event["queue"]))
        outcome = str(event["outcome"])
        if outcome == "succeeded":
            self._task_counter(self.tasks_succeeded, queue, event).inc()
        elif outcome == "canceled":
            self._task_counter(self.tasks_canceled, queue, event).inc()
        elif outcome in ("failed", "retried", "lease_lost"):
            reason = _failure_reason(outcome, str(event.get("reason") or ""))
            self._task_counter(self.tasks_failed, queue, event, reason).inc()
            if outcome == "retried":
                self._task_counter(self.tasks_retried, queue, event).inc()
        else:
            raise ValueError(f"unknown outcome {outcome!r}")
        duration_s = max(0.0, float(event.get("dur_s", 0.0)))
        self._child(self.task_duration, ("queue",), queue).observe(duration_s)

    def _on_dberr(self, group: str, slot: int, event: Mapping[str, Any]) -> None:
        self.db_error("child", str(event.get("kind", "other")))

    def _on_rss(self, group: str, slot: int, event: Mapping[str, Any]) -> None:
        if "rss" in event:
            labels = ("group", "slot")
            self._child(self.child_memory, labels, group, str(slot)).set(float(event["rss"]))

    _event_handlers: Mapping[str, Callable[[Metrics, str, int, Mapping[str, Any]], None]] = {
        "start": _on_start,
        "end": _on_end,
        "dberr": _on_dberr,
        "hb": _on_rss,
        "ready": _on_rss,
    }

    def _task_counter(
        self, counter: MetricWrapperBase, queue: str, event: Mapping[str, Any], *extra: str
    ) -> Any:
        labelnames = self._failed_labels if extra else self._task_labels
        values = (queue, *extra, str(event["name"])) if self._name_label else (queue, *extra)
        return self._child(counter, labelnames, *values)

    def db_error(self, component: str, kind: str) -> None:
        if component not in DB_ERROR_COMPONENTS:
            raise ValueError(f"component must be one of {', '.join(DB_ERROR_COMPONENTS)}")
        self.db_errors.labels(component, kind if kind in DB_ERROR_KINDS else "other").inc()

    def set_children(self, group: str, state_counts: Mapping[str, int]) -> None:
        """Children of `group` per state; states outside CHILD_STATES are not shown."""
        for state in CHILD_STATES:
            child = self._child(self.children, ("group", "state"), group, state)
            child.set(state_counts.get(state, 0))

    def set_children_desired(self, group: str, n: int) -> None:
        self._child(self.children_desired, ("group",), group).set(n)

    def child_restart(self, group: str, reason: str) -> None:
        """Count a replaced child. A reason outside RESTART_REASONS counts as `crash`
        (logged): a new kill path must not take the supervisor's loop down."""
        if reason not in RESTART_REASONS:
            log.warning("restart reason %r is not a metric label; counted as crash", reason)
            reason = "crash"
        self._child(self.child_restarts, ("group", "reason"), group, reason).inc()

    def set_group_state(self, group: str, state: str) -> None:
        _check_enum("state", state, GROUP_STATES)
        for candidate in GROUP_STATES:
            child = self._child(self.group_state, ("group", "state"), group, candidate)
            child.set(1 if candidate == state else 0)

    def remove_child(self, group: str, slot: int) -> None:
        """Drop a retired slot's RSS series."""
        self._series.remove(self.child_memory, group, str(slot))

    def remove_group(self, group: str) -> None:
        self._series.remove_where("group", lambda g: g != group)

    def reload_result(self, ok: bool, generation: int) -> None:
        self.config_reload_successful.set(1 if ok else 0)
        if ok:
            self.config_reload_success_time.set(self._wall_clock())
            self.config_generation.set(generation)

    def lease_recoveries(self, queue: str, reason: str, n: int) -> None:
        _check_enum("reason", reason, RECOVERY_REASONS)
        label = self.queue_labels.label(queue)
        self._child(self.lease_recoveries_total, ("queue", "reason"), label, reason).inc(n)

    def purge_started(self) -> None:
        self.purge_runs.inc()

    def purge_deleted(self, rule: str, n: int) -> None:
        self._child(self.purge_deleted_total, ("rule",), rule).inc(n)

    def purge_failed(self) -> None:
        self.purge_failures.inc()

    def purge_succeeded(self, at: float) -> None:
        self.purge_last_success.set(at)

    # -- serving ------------------------------------------------------------------------

    def serve(self, listen_host: str, port: int, health: Callable[[], bool] | None = None) -> int:
        """Serve `/metrics` and `/healthz` (200 while `health()` is true, else 503) on a
        daemon thread; returns the bound port (`port=0` picks a free one)."""
        if self._server is not None:
            raise RuntimeError(f"metrics already served on port {self._server.port}")
        self._server = _HttpServer(self.registry, listen_host, port, health or (lambda: True))
        return self._server.port

    @property
    def port(self) -> int | None:
        return None if self._server is None else self._server.port

    def close(self) -> None:
        """Stop the HTTP server and the database collector. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self.database.close()


def _failure_reason(outcome: str, reason: str) -> str:
    """Map a child's outcome and error code onto the bounded `reason` enum; a
    handler's own error codes are not label values."""
    if outcome == "lease_lost":
        return "lease_lost"
    if reason.startswith("max_run"):
        return "max_run"
    return reason if reason in FAILURE_REASONS else "error"


def _check_enum(what: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(allowed)}; got {value!r}")
