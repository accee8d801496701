"""The dashboard's database work: one thread, one store, one shared snapshot.

Pages but the task list and a task's page draw from one `Overview` snapshot, read at most
once per `dashboard.refresh` and shared by every browser; a stale one is served while the
next is read, and the interval stretches to five times the last read's duration. All on
a `LoopThread` of its own (docs/dashboard.md, "Live updates").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cairnqd.attempts import AttemptRecord
from cairnqd.config import Config
from cairnqd.daemon.parent.dbthread import LoopThread
from cairnqd.limits import Limit, Override, overridden
from cairnqd.models import STATUSES, Task
from cairnqd.queue_counts import Period, merged, percentile, periods_by_queue
from cairnqd.store.base import TaskStore
from cairnqd.store.browse import (
    REPORT_MAX_CHARS,
    DaemonReport,
    FailedGroup,
    SearchResult,
    TaskQuery,
    TaskSummary,
)
from cairnqd.store.dependencies import GRAPH_LIMIT, TaskGraph
from cairnqd.store.factory import store_for
from cairnqd.store.lazy import LazyStore
from cairnqd.store.operator import QueuePause, TaskFilter
from cairnqd.store.tables.fleet import FleetMember
from cairnqd.store.tables.limits import (
    Bypass,
    LimitUsage,
    PartitionUsage,
    RoomWait,
    full_budgets,
)
from cairnqd.store.tables.schedules import ScheduleRow, ScheduleTable

log = logging.getLogger("cairnqd.dashboard")

T = TypeVar("T")

#: How long a page waits for the database before it answers 503.
READ_TIMEOUT_S = 10.0
#: How long a bulk action by filter may take (a page of 500 tasks per transaction).
BULK_TIMEOUT_S = 300.0
#: Statements are bounded on the server (Postgres) and in the busy wait (SQLite).
_STATEMENT_TIMEOUT_MS = 8000
HOUR_MINUTES = 60
#: A daemon reports its groups and children this often at most (or every `refresh`).
REPORT_EVERY_S = 2.0
# How long to wait before trying again to build the task pages' indexes.
INDEX_RETRY_S = 60
#: A report older than this is shown as silent; one older than an hour is dropped.
REPORT_SILENT_S = 30.0
_REPORT_KEEP_MS = 3_600_000
#: The partitions of one limit the overview lists: the busiest by tasks waiting.
TOP_PARTITIONS = 5
#: The running tasks outside a limit the overview names, per limit.
BYPASSES_SHOWN = 10

#: What the daemon's control snapshot looks like (cairnqd/daemon/parent/control.py), or None.
DaemonView = Callable[[], "dict[str, Any] | None"]


class DatabaseError(Exception):
    """The database did not answer a page's read; the message says why."""


#: The charts' ranges (cairnqd/queue_counts.py keeps a width for each): name ->
#: (seconds per bar, bars).
RANGES = {"1h": (60, 60), "24h": (900, 96), "7d": (3600, 168)}
#: The overview's failed groups are read again once this old (or after an action).
FAILED_EVERY_S = 10.0
#: A range's charts are renewed once this old: workers add every 10 s.
CHARTS_FRESH_S = 5.0


@dataclass(frozen=True)
class QueueRow:
    queue: str
    counts: dict[str, int]
    oldest_queued_s: float | None
    pause: QueuePause | None
    #: (succeeded, failed) per minute of the last hour, oldest first.
    per_minute: list[tuple[int, int]]
    #: The last hour's 95th percentiles of wait and run time (ms), None without any.
    wait_p95_ms: float | None = None
    run_p95_ms: float | None = None
    #: Of `counts["queued"]`, the tasks waiting on their dependencies (not yet due).
    waiting: int = 0


@dataclass(frozen=True)
class Charts:
    """One range of every queue's counters (the Charts page): a bar per period."""

    range: str
    width_s: int
    first_ms: int
    taken_at_ms: int
    queues: dict[str, list[Period]]


def _hour_of(
    periods: Sequence[Period] | None,
) -> tuple[list[tuple[int, int]], float | None, float | None]:
    """A queue's last hour for the overview: (succeeded, failed) per minute and the
    95th percentiles of wait and run time."""
    if periods is None:
        return [(0, 0)] * HOUR_MINUTES, None, None
    wait = merged(p.wait for p in periods)
    run = merged(p.run for p in periods)
    return (
        [(p.finished, p.failed) for p in periods],
        percentile(wait, 0.95),
        percentile(run, 0.95),
    )


@dataclass(frozen=True)
class LimitRow:
    """One configured limit as the overview shows it (docs/limits.md): its budgets as in
    force (an operator's override applied), totals over its partitions, and the busiest
    few partitions, never all of them."""

    limit: Limit
    #: The limit as the config has it (`limit` differs under an override).
    configured: Limit
    override: Override | None
    in_use: int
    starts: int
    waiting: int
    #: The busiest partitions (at most `TOP_PARTITIONS`), by tasks waiting.
    top: tuple[PartitionUsage, ...]
    #: Partitions that hold or wait for anything, shown or not.
    partitions: int
    #: Partitions with no room now in some budget (`full_budgets`).
    full: int

    @classmethod
    def of(cls, usage: LimitUsage, configured: Limit, override: Override | None) -> LimitRow:
        parts = usage.partitions
        busiest = sorted(parts, key=lambda p: (-p.waiting, -p.in_use, -p.starts, p.part))
        lim = usage.limit
        return cls(
            limit=lim,
            configured=configured,
            override=override,
            in_use=usage.in_use,
            starts=sum(p.starts for p in parts),
            waiting=usage.waiting,
            top=tuple(busiest[:TOP_PARTITIONS]),
            partitions=len(parts),
            full=sum(1 for p in parts if full_budgets(lim, p)),
        )


@dataclass(frozen=True)
class HostView:
    """One daemon's groups and children: this process's own (live), or what another
    daemon last reported through the database."""

    daemon: str  # host/pid
    host: str
    view: dict[str, Any]
    #: Seconds since the report; None for the live view of this host's daemon.
    age_s: float | None = None

    @property
    def stopped(self) -> bool:
        """Its last report says it stopped cleanly."""
        return bool(self.view.get("stopped"))

    @property
    def silent(self) -> bool:
        """Reported, but not lately, and not stopped: the daemon may be gone."""
        return self.age_s is not None and self.age_s > REPORT_SILENT_S and not self.stopped

    @property
    def instance(self) -> str:
        """The daemon's name (`instance` in its config; a report of an older daemon
        has none: its host)."""
        name = self.view.get("instance")
        return name if isinstance(name, str) and name else self.host


@dataclass(frozen=True)
class Overview:
    taken_at_ms: int
    queues: list[QueueRow]
    failed_groups: list[FailedGroup]
    schedules: dict[str, ScheduleRow]
    #: The daemon's own view (groups, children), None when none answers.
    daemon: dict[str, Any] | None
    daemon_note: str | None
    problem: str | None = None
    totals: dict[str, int] = field(default_factory=dict)
    #: Which read of the database this is (1 for the first): pages show it, tests check
    #: that browsers share reads.
    serial: int = 0
    #: Every daemon's groups and children: this host's first, then the reports.
    hosts: list[HostView] = field(default_factory=list)
    #: The daemons live on the database (the fleet registry), reporting or not.
    fleet: list[FleetMember] = field(default_factory=list)
    #: Each limit of the config (empty: none configured, and no Limits section).
    limits: list[LimitRow] = field(default_factory=list)
    #: Running tasks a limit covers that do not count in it (at most a few per limit).
    bypasses: list[Bypass] = field(default_factory=list)
    #: Per queue, the limits holding back its due tasks now.
    throttled: dict[str, list[str]] = field(default_factory=dict)
    #: Seconds the read took without the failed groups (read more rarely): what the
    #: refresh interval stretches by.
    read_s: float = 0.0


async def _read_charts(store: TaskStore, range_name: str) -> Charts:
    width_s, bars = RANGES[range_name]
    now_ms = store.now_ms()
    width_ms = width_s * 1000
    first_ms = now_ms - now_ms % width_ms - (bars - 1) * width_ms
    rows = await store.queue_counts.read(width_s, first_ms)
    return Charts(
        range_name, width_s, first_ms, now_ms, periods_by_queue(rows, first_ms, width_s, bars)
    )


def _hosts(local: dict[str, Any] | None, reports: Sequence[DaemonReport]) -> list[HostView]:
    """This host's daemon (live) first, then every other daemon's last report."""
    host = socket.gethostname()
    hosts: list[HostView] = []
    mine = None
    if local is not None:
        mine = f"{host}/{local.get('pid')}"
        hosts.append(HostView(daemon=mine, host=host, view=local))
    for report in reports:
        if report.daemon == mine:
            continue
        try:
            view = json.loads(report.snapshot)
        except ValueError:
            continue
        if isinstance(view, dict):
            hosts.append(HostView(report.daemon, report.host, view, report.age_ms / 1000))
    return hosts


def report_json(view: dict[str, Any]) -> str:
    """The daemon's view as stored for other hosts' dashboards. A daemon with very
    many busy children leaves out their running-task lists rather than the report."""
    text = json.dumps(view)
    if len(text) <= REPORT_MAX_CHARS:
        return text
    # A copy: the view is the snapshot `cairnqd status` is served too.
    lean = {
        key: [
            {**g, "children": [{**c, "running": []} for c in g.get("children", [])]}
            for g in view.get(key, [])
        ]
        for key in ("groups", "removed_groups")
    }
    return json.dumps({**view, **lean})


class DashboardData:
    """The dashboard's reads and writes, on a thread of its own."""

    def __init__(
        self,
        config: Config,
        *,
        daemon_view: DaemonView | None = None,
        store_factory: Callable[[], TaskStore] | None = None,
        report_as: str | None = None,
    ) -> None:
        """`daemon_view` gives this host's daemon's status (groups, children);
        `report_as` (host/pid) makes it also write that status to the database every
        `REPORT_EVERY_S`, so dashboards on other hosts show these workers."""
        self.config = config
        self.report_as = report_as
        #: Reports written so far (tests read it).
        self.reports = 0
        self.refresh_s = config.dashboard.refresh.total_seconds()
        self._daemon_view = daemon_view
        factory = store_factory or (
            lambda: store_for(
                config.database, "background", statement_timeout_ms=_STATEMENT_TIMEOUT_MS
            )
        )
        self._store_factory = factory
        self._store = LazyStore(factory)
        self._thread = LoopThread("cairnqd-dashboard-db")
        self._lock = threading.Lock()
        self._overview: Overview | None = None
        self._taken_at = float("-inf")
        #: Each range's last charts, with when (monotonic) they were read, and the
        #: reads under way, by range.
        self._charts: dict[str, tuple[float, Charts]] = {}
        self._charts_reading: dict[str, concurrent.futures.Future[Charts]] = {}
        #: The failed groups last read (monotonic time, groups), and whether an action
        #: since then made them stale; only the database thread reads and writes them.
        self._failed: tuple[float, list[FailedGroup]] | None = None
        self._failed_stale = False
        self._inflight: concurrent.futures.Future[Overview] | None = None
        #: Set by an action: the next page waits for a fresh read instead of the old one.
        self._must_wait = False
        #: Actions so far (`invalidate`). A read counts as fresh only if no action came
        #: after it began: one that began before a pause cannot show the pause.
        self._generation = 0
        #: The generation of the read in flight, and of the snapshot held.
        self._inflight_generation = 0
        self._overview_generation = 0
        #: How long the last snapshot read took (seconds).
        self.last_read_s = 0.0
        #: Snapshots read from the database so far; tests and the bench read it.
        self.refreshes = 0
        #: The task pages' indexes exist (`build_indexes` finished).
        self.indexes_ready = False
        #: The report loop, while it runs; set once `stop` began (no report after it).
        self._reporting: concurrent.futures.Future[None] | None = None
        self._stopped = False
        self._wake: asyncio.Event | None = None

    def start(self) -> None:
        self._thread.start()
        self._stopped = False
        if self.report_as is not None and self._daemon_view is not None:
            self._reporting = self._thread.submit(self._report_loop())

    def build_indexes(self) -> None:
        """Have the task pages' indexes built, in the background: pages are served
        meanwhile (on a large table, slower until the build ends). Only a database a
        dashboard reads carries them; protocol/extensions/on_demand says why."""
        self._thread.submit(self._build_indexes())

    async def _build_indexes(self) -> None:
        """Build until it works: a busy SQLite file or a database that is down now may
        let it through later. The first failure is a warning, the rest are debug."""
        failures = 0
        while True:
            began = time.monotonic()
            # A store of its own: the pages' reads never queue behind the build (or
            # lose their connection when a failed build is cleaned up).
            store = self._store_factory()
            try:
                await store.connect()
                await store.ensure_schema("dashboard_indexes")
                break
            except Exception as exc:
                log.log(
                    logging.DEBUG if failures else logging.WARNING,
                    "dashboard: cannot create its indexes on cairnq_tasks (%s: %s); task "
                    "pages still work, reading a large table more slowly; retrying every %ds",
                    type(exc).__name__,
                    exc,
                    INDEX_RETRY_S,
                )
                failures += 1
            finally:
                with contextlib.suppress(Exception):
                    await store.close()
            await asyncio.sleep(INDEX_RETRY_S)
        self.indexes_ready = True
        took = time.monotonic() - began
        if took >= 1.0 or failures:
            log.info("dashboard: its indexes on cairnq_tasks are ready (built in %.1fs)", took)

    async def _report_loop(self) -> None:
        """Write this daemon's status every few seconds; a failure is retried at the
        next turn (the pages say when the database does not answer)."""
        every = max(self.refresh_s, REPORT_EVERY_S)
        assert self.report_as is not None
        host = socket.gethostname()
        self._wake = asyncio.Event()
        while not self._stopped:
            view, _ = self._daemon()
            if view is not None:
                try:
                    store = await self._store.get()
                    await store.reports.put(self.report_as, host, report_json(view))
                    if self.reports % 100 == 0:
                        await store.reports.prune(_REPORT_KEEP_MS)
                    self.reports += 1
                except Exception as exc:
                    log.debug("dashboard: cannot report this daemon's status: %s", exc)
                    await self._store.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), every)
        await self._report_stopped()

    async def _report_stopped(self) -> None:
        """This daemon's last report, on a clean stop: stopped, with no groups left, so
        other hosts' Workers pages say so at once instead of "stopping" for an hour."""
        view, _ = self._daemon()
        if self.report_as is None or view is None:
            return
        final = {**view, "stopping": False, "stopped": True, "groups": [], "removed_groups": []}
        store = await self._store.get()
        await store.reports.put(self.report_as, socket.gethostname(), json.dumps(final))

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopped = True
        reporting, self._reporting = self._reporting, None
        if reporting is not None:
            # The report loop wakes, sees the stop and writes its last report itself:
            # never two writes at once on its store.
            wake = self._wake
            if wake is not None:
                self._thread.call_soon(wake.set)
            try:
                reporting.result(timeout_s)
            except Exception as exc:  # the database is down: the report goes silent
                log.debug("dashboard: cannot report this daemon stopped: %s", exc)
        if self._thread.running():
            try:
                self._thread.submit(self._store.close()).result(timeout_s)
            except Exception as exc:  # closing must not stop the shutdown
                log.debug("closing the dashboard's store: %s", exc)
        self._thread.stop(timeout_s)

    # -- running on the thread ----------------------------------------------------------

    def _run(
        self,
        work: Callable[[TaskStore], Coroutine[Any, Any, T]],
        what: str,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> T:
        async def call() -> T:
            try:
                store = await self._store.get()
                return await work(store)
            except Exception:
                # A broken connection is opened afresh on the next read.
                await self._store.close()
                raise

        future = self._thread.submit(call())
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise DatabaseError(f"{what}: the database did not answer within "
                                f"{timeout_s:.0f}s") from None  # fmt: skip
        except (ValueError, DatabaseError):
            raise
        except Exception as exc:
            raise DatabaseError(f"{what}: {type(exc).__name__}: {exc}") from exc

    # -- the shared snapshot --------------------------------------------------------------

    def overview(self) -> Overview:
        """The shared snapshot. A stale one is still served at once while one read
        renews it in the background (so a page never waits on the database's
        aggregates once a snapshot exists); only the first read, or one after an
        action (`invalidate`), is waited for. Concurrent callers share one read."""
        started: concurrent.futures.Future[Overview] | None = None
        with self._lock:
            current = self._overview
            if current is not None and time.monotonic() - self._taken_at < self._interval():
                return current
            # A read in flight that began before the last action would not show it:
            # start another beside it rather than wait for that one.
            if self._inflight is None or self._inflight_generation != self._generation:
                generation, began = self._generation, time.monotonic()
                started = self._inflight = self._thread.submit(self._read_overview())
                self._inflight_generation = generation
            inflight = self._inflight
            stale = None if self._must_wait else current
        if started is not None:
            # Outside the lock: on a read that has already finished (a quick one, this
            # thread descheduled meanwhile) `add_done_callback` runs `_landed` right
            # here, and `_landed` takes the lock. Under it, that deadlocked every page.
            started.add_done_callback(functools.partial(self._landed, generation, began))
        if stale is not None:
            return stale
        # The read's own result, not `self._overview`: the waiters wake before the done
        # callback (`_landed`) has stored it.
        try:
            return inflight.result(READ_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            return self._failed_overview("the database did not answer in time")
        except Exception as exc:
            return self._failed_overview(f"{type(exc).__name__}: {exc}")

    async def _failed_groups(self, store: TaskStore) -> list[FailedGroup]:
        """The failed groups, read again once `FAILED_EVERY_S` old or after an action:
        grouping every failed row costs more than all the counts together on a big
        table, and the counts must stay fresh."""
        kept = self._failed
        fresh = kept is not None and time.monotonic() - kept[0] < FAILED_EVERY_S
        if kept is not None and fresh and not self._failed_stale:
            return kept[1]
        self._failed_stale = False
        groups = await store.dashboard.failed_groups()
        self._failed = (time.monotonic(), groups)
        return groups

    def _interval(self) -> float:
        """`refresh`, stretched to five times the last read's duration (the failed
        groups left out): on a database where the aggregates take long the dashboard
        reads less often rather than keeping a connection busy."""
        return max(self.refresh_s, 5 * self.last_read_s)

    def _landed(
        self, generation: int, began: float, future: concurrent.futures.Future[Overview]
    ) -> None:
        try:
            overview = future.result()
        except Exception as exc:
            if isinstance(exc, concurrent.futures.CancelledError):
                problem = "the read was canceled"
            else:
                problem = f"{type(exc).__name__}: {exc}"
            overview = self._failed_overview(problem)
        with self._lock:
            if self._inflight is future:
                self._inflight = None
            self.last_read_s = overview.read_s or time.monotonic() - began
            if generation < self._overview_generation:
                return  # a read older than the snapshot held, which it would set back
            self._overview, self._overview_generation = overview, generation
            if generation == self._generation:  # no action since it began: fresh
                self._taken_at = time.monotonic()
                self._must_wait = False

    def _failed_overview(self, problem: str) -> Overview:
        daemon, note = self._daemon()
        old = self._overview
        return Overview(
            taken_at_ms=int(time.time() * 1000),
            queues=old.queues if old else [],
            failed_groups=old.failed_groups if old else [],
            schedules=old.schedules if old else {},
            daemon=daemon,
            daemon_note=note,
            problem=f"the database did not answer: {problem}"
            + (" (showing the last counts read)" if old else ""),
            totals=old.totals if old else {},
            serial=old.serial if old else 0,
            hosts=_hosts(daemon, []) + [h for h in (old.hosts if old else []) if h.age_s],
            limits=old.limits if old else [],
            bypasses=old.bypasses if old else [],
            throttled=old.throttled if old else {},
        )

    def _daemon(self) -> tuple[dict[str, Any] | None, str | None]:
        if self._daemon_view is None:
            return None, "no daemon runs in this process"
        try:
            view = self._daemon_view()
        except Exception as exc:
            return None, str(exc)
        if view is None:
            return None, "the daemon has published no status yet"
        return view, None

    async def _read_overview(self) -> Overview:
        began = time.monotonic()
        try:
            store = await self._store.get()
            now_ms = store.now_ms()
            stats = await store.stats()
            oldest = await store.oldest_queued_age_ms()
            # Rows of tasks held by dependencies only: an empty table without them.
            waiting = await store.waiting_counts()
            pauses = {p.queue: p for p in await store.pauses.all()}
            first_ms = now_ms - now_ms % 60_000 - (HOUR_MINUTES - 1) * 60_000
            counted = await store.queue_counts.read(60, first_ms)
            schedules = await ScheduleTable(store).rows() if self.config.schedules else {}
            reports = await store.reports.all()
            fleet = await store.fleet.live()
            limits, bypasses, throttled = await self._read_limits(store)
            read_s = time.monotonic() - began
            failed = await self._failed_groups(store)
        except Exception:
            await self._store.close()
            raise
        self.refreshes += 1
        series = periods_by_queue(counted, first_ms, 60, HOUR_MINUTES)
        names = sorted(set(stats) | set(pauses) | set(series) | self._configured_queues())
        queues = []
        totals: dict[str, int] = dict.fromkeys(STATUSES, 0)
        for name in names:
            counts: dict[str, int] = {s: int(stats.get(name, {}).get(s, 0)) for s in STATUSES}
            for s in STATUSES:
                totals[s] += counts[s]
            age = oldest.get(name)
            per_minute, wait_p95, run_p95 = _hour_of(series.get(name))
            queues.append(
                QueueRow(
                    queue=name,
                    counts=counts,
                    oldest_queued_s=None if age is None else age / 1000,
                    pause=pauses.get(name),
                    per_minute=per_minute,
                    wait_p95_ms=wait_p95,
                    run_p95_ms=run_p95,
                    waiting=waiting.get(name, 0),
                )
            )
        daemon, note = self._daemon()
        return Overview(
            taken_at_ms=now_ms,
            queues=queues,
            failed_groups=failed,
            schedules=schedules,
            daemon=daemon,
            daemon_note=note,
            totals=totals,
            serial=self.refreshes,
            hosts=_hosts(daemon, reports),
            fleet=fleet,
            limits=limits,
            bypasses=bypasses,
            throttled=throttled,
            read_s=read_s,
        )

    async def _read_limits(
        self, store: TaskStore
    ) -> tuple[list[LimitRow], list[Bypass], dict[str, list[str]]]:
        """The config's limits as `cairnqd limits` reads them, the tasks running outside
        them, and the queues they hold back; nothing when the config has none. The
        dashboard takes its limits from the config it was started with, as it takes
        the groups and schedules (the daemon's, or the file `cairnqd dashboard` reads)."""
        configured = self.config.flow_limits()
        if not configured:
            return [], [], {}
        table = store.limit_table
        overrides = {o.name: o for o in await table.overrides()}
        kept = overridden(configured, overrides.values())
        usages = await table.usage(kept)
        bypasses = await table.bypassing(kept, most=BYPASSES_SHOWN)
        throttled = await table.holding_back(usages)
        rows = [
            LimitRow.of(usage, written, overrides.get(written.name))
            for usage, written in zip(usages, configured, strict=True)
        ]
        return rows, bypasses, throttled

    def _configured_queues(self) -> set[str]:
        found: set[str] = set()
        for group in self.config.groups.values():
            found.update(group.queues)
        return found

    def invalidate(self) -> None:
        """Make the next page wait for a fresh snapshot, read after this call (after an
        action; the bench)."""
        self._failed_stale = True
        with self._lock:
            self._generation += 1
            self._taken_at = float("-inf")
            self._must_wait = True

    # -- per-page reads -----------------------------------------------------------------

    def tasks(self, query: TaskQuery) -> list[TaskSummary]:
        async def read(store: TaskStore) -> list[TaskSummary]:
            return await store.dashboard.browse(query)

        return self._run(read, "the task list")

    def charts(self, range_name: str) -> Charts:
        """Every queue's counters over `range_name` (a key of RANGES): a bounded range
        of the counters' key, never the task table. Like the overview, charts older
        than `CHARTS_FRESH_S` are still served at once while one read renews them in
        the background; every range is read once when the dashboard starts
        (`warm_charts`), so no view waits for a read unless it comes first."""
        with self._lock:
            cached = self._charts.get(range_name)
            stale = cached is None or time.monotonic() - cached[0] >= CHARTS_FRESH_S
            reading = self._charts_reading.get(range_name)
        if stale and reading is None:
            reading = self._renew(range_name)
        if cached is not None:
            return cached[1]
        assert reading is not None
        try:
            return reading.result(READ_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            raise DatabaseError(f"the charts of the last {range_name}: the database did not "
                                f"answer within {READ_TIMEOUT_S:.0f}s") from None  # fmt: skip
        except Exception as exc:
            raise DatabaseError(
                f"the charts of the last {range_name}: {type(exc).__name__}: {exc}"
            ) from exc

    def warm_charts(self) -> None:
        """Read every range's charts in the background (the dashboard's start)."""
        for range_name in RANGES:
            self._renew(range_name)

    def forget_charts(self) -> None:
        """Drop the charts held, so the next view of each range waits for its read (the
        bench times that read)."""
        with self._lock:
            self._charts.clear()

    def _renew(self, range_name: str) -> concurrent.futures.Future[Charts]:
        """The read of `range_name` under way, started if none is."""
        with self._lock:
            reading = self._charts_reading.get(range_name)
            if reading is not None:
                return reading
            reading = self._charts_reading[range_name] = self._thread.submit(
                self._read_charts(range_name)
            )
        # Outside the lock: a read already done runs the callback right here.
        reading.add_done_callback(functools.partial(self._charts_landed, range_name))
        return reading

    async def _read_charts(self, range_name: str) -> Charts:
        try:
            return await _read_charts(await self._store.get(), range_name)
        except Exception:
            await self._store.close()  # opened afresh on the next read
            raise

    def _charts_landed(self, range_name: str, done: concurrent.futures.Future[Charts]) -> None:
        with self._lock:
            self._charts_reading.pop(range_name, None)
            if done.cancelled() or done.exception() is not None:
                return  # stale charts stay; the next view tries again
            self._charts[range_name] = (time.monotonic(), done.result())

    def task(self, task_id: str) -> tuple[Task | None, str | None]:
        async def read(store: TaskStore) -> tuple[Task | None, str | None]:
            task = await store.get(task_id)
            key = await store.dashboard.task_key(task_id) if task is not None else None
            return task, key

        return self._run(read, f"task {task_id}")

    def attempts(self, task_id: str) -> list[AttemptRecord]:
        """Every recorded attempt of `task_id`, in the order they ran."""

        async def read(store: TaskStore) -> list[AttemptRecord]:
            return await store.attempts.of(task_id)

        return self._run(read, f"the attempts of task {task_id}")

    def dependencies(self, task_id: str, listed: int) -> tuple[list[Task], list[Task], int]:
        """The parents of `task_id` (in the order its submit named them), the first
        `listed` tasks submitted after it and how many there are: reads by the
        dependency edges' indexes, never every dependent of a wide fan-out."""

        async def read(store: TaskStore) -> tuple[list[Task], list[Task], int]:
            return (
                await store.dependencies(task_id),
                await store.dependents(task_id, limit=listed),
                await store.count_dependents(task_id),
            )

        return self._run(read, f"the dependencies of task {task_id}")

    def graph(self, task_id: str) -> tuple[Task | None, TaskGraph]:
        """`task_id` and the dependency graph it belongs to, at most `GRAPH_LIMIT` tasks."""

        async def read(store: TaskStore) -> tuple[Task | None, TaskGraph]:
            task = await store.get(task_id)
            if task is None:
                return None, TaskGraph([])
            return task, await store.graph(task_id, limit=GRAPH_LIMIT)

        return self._run(read, f"the dependency graph of task {task_id}")

    def waiting_for(self, task: Task) -> list[RoomWait]:
        """Why `task` waits for room in a limit of the config, if it does (a queued,
        due task whose budget is full); empty without limits."""
        limits = self.config.flow_limits()
        if not limits or task.status != "queued":
            return []

        async def read(store: TaskStore) -> list[RoomWait]:
            return await store.limit_table.waiting_for(task, limits)

        return self._run(read, f"the limits of task {task.id}")

    def search(self, text: str, *, scan: int, limit: int) -> SearchResult:
        """The search box's tasks among the newest `scan` (store/tables/dashboard.py)."""

        async def read(store: TaskStore) -> SearchResult:
            return await store.dashboard.search(text, scan=scan, limit=limit)

        return self._run(read, "the search")

    def count(self, where: TaskFilter) -> int:
        """How many tasks a bulk action by filter would cover."""

        async def read(store: TaskStore) -> int:
            return await store.bulk.count(where)

        return self._run(read, "the count of matching tasks")

    # -- writes (actions) -----------------------------------------------------------------

    def write(
        self,
        work: Callable[[TaskStore], Coroutine[Any, Any, T]],
        what: str,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> T:
        """Run an action's writes on the dashboard's thread and store; the next page
        reads a fresh snapshot. Past `timeout_s` the work is stopped where it is (a
        bulk action keeps the pages it committed) and the page says so."""
        try:
            return self._run(work, what, timeout_s)
        finally:
            self.invalidate()


async def bulk_failed(
    store: TaskStore, name: str, error_type: str, *, discard: bool, batch: int = 500
) -> int:
    """Retry (or discard) every failed task of one group of the Failed page, a page
    of ids per transaction; how many changed."""
    changed, after = 0, ""
    while True:
        ids = await store.dashboard.failed_group_ids(name, error_type, after_id=after, limit=batch)
        if not ids:
            return changed
        if discard:
            changed += len(await store.dashboard.discard_failed(ids))
        else:
            changed += len(await store.bulk.retry(ids))
        after = ids[-1]
        await asyncio.sleep(0)


__all__ = [
    "BULK_TIMEOUT_S",
    "DashboardData",
    "DatabaseError",
    "HostView",
    "LimitRow",
    "Overview",
    "QueueRow",
    "bulk_failed",
]
