"""The families the parent defines itself, as prometheus_client objects in one registry.

The database gauges are a custom collector of their own (`database.py`). The task
families' label names and buckets come from config and are fixed at creation, so a
reload that changes them has `Metrics` rebuild those; every other family is built once.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from cairnqd.config import MetricsConfig
from cairnqd.daemon.parent.metrics.buckets import BucketHistogram
from cairnqd.daemon.parent.metrics.schedules import ScheduleFamilies


class Families:
    """The registry and its families, by name; `Metrics` adds the updates."""

    def __init__(self, settings: MetricsConfig) -> None:
        self.registry = CollectorRegistry()
        self._build_process_metrics()
        self._build_task_metrics(settings)

    def _build_process_metrics(self) -> None:
        r = self.registry
        self.db_errors = Counter(
            "cairnq_db_errors_total",
            "DB errors survived, by component and kind (busy, timeout, connect, full, other).",
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
            "Children replaced (crash, signal, heartbeat_timeout, stall, boot_failure, max_run, "
            "cancel, max_tasks, max_memory, reload).",
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
        self.child_tasks = Gauge(
            "cairnq_child_tasks",
            "Tasks each child holds: executing (handler running or result being written) "
            "or held (claimed ahead, waiting for a free slot).",
            ["group", "slot", "state"],
            registry=r,
        )
        self.child_loop_lag = Gauge(
            "cairnq_child_loop_lag_seconds",
            "How long each child's event loop has gone without running, from its heartbeats.",
            ["group", "slot"],
            registry=r,
        )
        self.child_listen_deaf = Gauge(
            "cairnq_child_listen_deaf",
            "1 while a child's LISTEN is accepted but deaf (its self-addressed NOTIFY did not "
            "come back, e.g. through a transaction pooler): it polls instead of being woken.",
            ["group", "slot"],
            registry=r,
        )
        self.listen_deaf = Gauge(
            "cairnq_listen_deaf",
            "1 while the parent's LISTEN on database.direct_dsn is accepted but deaf: the "
            "children poll instead of being woken.",
            registry=r,
        )
        self._build_purge_metrics()
        self._build_config_metrics()
        self.schedules = ScheduleFamilies(r)

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
            ["version", "protocol", "pipe_protocol", "python", "backend"],
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
            "Attempts that failed, retried or not (error, max_run, worker_lost, lease_lost, "
            "undecodable).",
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
        # Children send these already bucketed (`daemon.tally`).
        self.task_duration = BucketHistogram(
            "cairnq_task_duration_seconds",
            "Wall time of task attempts.",
            ["queue"],
            settings.duration_buckets,
        )
        self.task_queue_wait = BucketHistogram(
            "cairnq_task_queue_wait_seconds",
            "Time from run_at to claim.",
            ["queue"],
            settings.wait_buckets,
        )
        r.register(self.task_duration)
        r.register(self.task_queue_wait)

    def _task_metrics(self) -> list[Any]:
        return [
            self.tasks_started,
            self.tasks_succeeded,
            self.tasks_failed,
            self.tasks_retried,
            self.tasks_canceled,
            self.task_duration,
            self.task_queue_wait,
        ]
