"""`Metrics`: every family the daemon exports, in the parent's one registry, and the
updates made to it.

Known label combinations start at 0 (a rate() over a series that appears only on its
first increment misses that increment); a dropped queue, group or rule has its series
removed on reload. `disable_created_metrics()` drops the `_created` series
(process-wide, which is what the daemon wants).
"""

from __future__ import annotations

import logging
import platform
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import disable_created_metrics

from cairnqd import __version__
from cairnqd.config import Config
from cairnqd.daemon.parent.metrics.database import (
    DB_CALL_TIMEOUT_S,
    DB_QUERY_TIMEOUT_S,
    DatabaseCollector,
)
from cairnqd.daemon.parent.metrics.families import Families
from cairnqd.daemon.parent.metrics.labels import (
    CHILD_STATES,
    DB_ERROR_COMPONENTS,
    DB_ERROR_KINDS,
    FAILURE_REASONS,
    GROUP_STATES,
    RECOVERY_REASONS,
    RESTART_REASONS,
    QueueLabels,
    check_enum,
    configured_queues,
)
from cairnqd.daemon.parent.metrics.series import Labelled, SeriesBook
from cairnqd.daemon.parent.metrics.server import Health, HttpServer
from cairnqd.daemon.parent.metrics.tallies import TallyBook
from cairnqd.daemon.parent.parent_store import parent_store
from cairnqd.daemon.wire.messages import (
    PROTOCOL_VERSION,
    ChildMessage,
    DatabaseTrouble,
    Heartbeat,
    Ready,
    Tally,
)
from cairnqd.store.base import TaskStore
from cairnqd.store.migrate import STORAGE_PROTOCOL_VERSION

# One logger for the whole metrics package: one name to filter on.
log = logging.getLogger("cairnqd.metrics")


class Metrics(Families):
    """Every exported family in one registry, and the updates the supervisor makes.

    Updates are thread-safe (the maintenance thread reports recoveries and purges);
    label values are bounded as `labels` says.
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
        super().__init__(config.metrics)
        self._config = config
        self._wall_clock = wall_clock
        self._series = SeriesBook()
        self._tallies = TallyBook()
        self.queue_labels = QueueLabels(configured_queues(config))
        self._server: HttpServer | None = None
        factory = store_factory or (
            lambda: parent_store(
                config.database,
                statement_timeout_ms=int(DB_QUERY_TIMEOUT_S * 1000),
                call_timeout_s=DB_CALL_TIMEOUT_S,
            )
        )
        self.database = DatabaseCollector(
            factory,
            queue_labels=self.queue_labels,
            ttl_s=config.metrics.stats_ttl.total_seconds(),
            queue_stats=config.metrics.queue_stats,
            lock_namespace=config.database.lock_namespace,
        )
        self.database.set_limits(config.flow_limits())
        self.registry.register(self.database)
        self.build_info.labels(
            __version__,
            str(STORAGE_PROTOCOL_VERSION),
            str(PROTOCOL_VERSION),
            platform.python_version(),
            config.database.backend,
        ).set(1)
        # Baseline: a fresh daemon is not "stale"; its first sweep is an interval away.
        self.purge_last_success.set(wall_clock())
        self.reload_result(True, generation)
        self._zero_known(config)

    # -- known series ---------------------------------------------------------------------

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
        self.schedules.configure(config.schedules)

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

    def _child(self, metric: Labelled, labelnames: Sequence[str], *values: str) -> Any:
        return self._series.child(metric, labelnames, *values)

    # -- reload ---------------------------------------------------------------------------

    def apply_config(self, config: Config) -> None:
        """Parent-hot `metrics.*` and the known combinations after a reload: new queues,
        groups and rules start at 0, dropped ones lose their series."""
        dropped_queues = set(configured_queues(self._config)) - set(configured_queues(config))
        self._config = config
        settings = config.metrics
        shape = (settings.task_name_label, (settings.duration_buckets, settings.wait_buckets))
        if shape != (self._name_label, self._buckets):
            # A family's label names and buckets are fixed at creation: replace them.
            for metric in self._task_metrics():
                self.registry.unregister(metric)
                self._series.forget(metric)
            self._build_task_metrics(settings)
        self.queue_labels.configure(configured_queues(config))
        self.database.set_ttl(settings.stats_ttl.total_seconds())
        self.database.set_queue_stats(settings.queue_stats, config.database.lock_namespace)
        self.database.set_limits(config.flow_limits())
        groups = set(config.groups)
        rules = {str(i) for i in range(len(config.retention.rules))}
        self._series.remove_where("queue", lambda queue: queue not in dropped_queues)
        self._series.remove_where("group", lambda group: group in groups)
        self._series.remove_where("rule", lambda rule: rule in rules)
        self._zero_known(config)

    # -- updates from the supervisor --------------------------------------------------------

    def record_event(self, group: str, slot: int, event: ChildMessage, *, child: str = "") -> None:
        """Count one message from child `group`/`slot` (`child` names the incarnation,
        whose tallies are cumulative); kinds without counters are ignored. Messages
        come decoded (`messages.decode_child`), so fields are typed."""
        match event:
            case Tally():
                self._on_tally(child or f"{group}/{slot}", event)
            case DatabaseTrouble():
                self.db_error("child", event.error_kind)
            case Heartbeat():
                labels = (group, str(slot))
                self._child(self.child_memory, ("group", "slot"), *labels).set(event.rss)
                self._child(self.child_loop_lag, ("group", "slot"), *labels).set(event.lag_s)
                deaf = self._child(self.child_listen_deaf, ("group", "slot"), *labels)
                deaf.set(1 if event.listen_deaf else 0)
                tasks = self.child_tasks
                names = ("group", "slot", "state")
                self._child(tasks, names, *labels, "executing").set(event.executing)
                self._child(tasks, names, *labels, "held").set(event.held)
            case Ready():
                self._child(self.child_memory, ("group", "slot"), group, str(slot)).set(event.rss)

    def parent_listen_deaf(self) -> None:
        """The parent's LISTEN on direct_dsn turned out deaf (from its relay thread)."""
        self.listen_deaf.set(1)

    def forget_incarnation(self, child: str) -> None:
        """A child was reaped: its next incarnation's tallies start from zero."""
        self._tallies.forget(child)

    def _on_tally(self, child: str, tally: Tally) -> None:
        try:
            counters, histograms = self._tallies.apply(child, tally)
        except ValueError as exc:
            log.warning("ignoring a malformed tally from child %s: %s", child, exc)
            return
        for delta in counters:
            queue = self.queue_labels.label(delta.queue)
            if delta.kind == "failed":
                counter = self._task_counter(self.tasks_failed, queue, delta.name, delta.reason)
            else:
                counter = self._task_counter(self._counters[delta.kind], queue, delta.name)
            counter.inc(delta.amount)
        for histogram in histograms:
            queue = self.queue_labels.label(histogram.queue)
            family = self.task_duration if histogram.which == "durations" else self.task_queue_wait
            try:
                self._child(family, ("queue",), queue).add(histogram.counts, histogram.total)
            except ValueError as exc:  # bucket counts of another config
                log.debug("ignoring %s from child %s: %s", histogram.which, child, exc)

    @property
    def _counters(self) -> dict[str, Labelled]:
        return {
            "started": self.tasks_started,
            "succeeded": self.tasks_succeeded,
            "retried": self.tasks_retried,
            "canceled": self.tasks_canceled,
        }

    def _task_counter(self, counter: Labelled, queue: str, name: str, *extra: str) -> Any:
        labelnames = self._failed_labels if extra else self._task_labels
        values = (queue, *extra, name) if self._name_label else (queue, *extra)
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
        check_enum("state", state, GROUP_STATES)
        for candidate in GROUP_STATES:
            child = self._child(self.group_state, ("group", "state"), group, candidate)
            child.set(1 if candidate == state else 0)

    def remove_child(self, group: str, slot: int) -> None:
        """Drop a retired slot's per-child series."""
        self._series.remove(self.child_memory, group, str(slot))
        self._series.remove(self.child_loop_lag, group, str(slot))
        for state in ("executing", "held"):
            self._series.remove(self.child_tasks, group, str(slot), state)

    def reload_result(self, ok: bool, generation: int) -> None:
        self.config_reload_successful.set(1 if ok else 0)
        if ok:
            self.config_reload_success_time.set(self._wall_clock())
            self.config_generation.set(generation)

    def lease_recoveries(self, queue: str, reason: str, n: int) -> None:
        check_enum("reason", reason, RECOVERY_REASONS)
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

    def serve(
        self,
        listen_host: str,
        port: int,
        health: Callable[[], Health] | None = None,
        adopted: socket.socket | None = None,
    ) -> int:
        """Serve `/metrics` and `/healthz` (200 or 503 as `health()` says, with its JSON
        body) on a daemon thread; returns the bound port (`port=0` picks a free one).
        `adopted`: a listening socket inherited in a binary upgrade, served instead."""
        if self._server is not None:
            raise RuntimeError(f"metrics already served on port {self._server.port}")
        check = health or (lambda: (True, {"status": "ok"}))
        self._server = HttpServer(self.registry, listen_host, port, check, adopted)
        return self._server.port

    @property
    def port(self) -> int | None:
        return None if self._server is None else self._server.port

    @property
    def listening_socket(self) -> socket.socket | None:
        """The socket `/metrics` is served on, for a successor to adopt."""
        return None if self._server is None else self._server.socket

    def stop_serving(self) -> None:
        """Stop the HTTP server (a successor serves on its socket now). Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.close()

    def close(self) -> None:
        """Stop the HTTP server and the database collector. Idempotent."""
        self.stop_serving()
        self.database.close()
