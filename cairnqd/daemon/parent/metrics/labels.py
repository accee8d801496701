"""The metric families' names and the bounded label values they may carry.

Cardinality. Label values come from config or fixed enums. Queues this host does not
configure keep their name for the first 20 seen; the rest are summed as
`queue="_other"`. A value outside an enum is refused (or, where a refusal would take the
supervisor's loop down, mapped onto the enum) rather than minted as a new series.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from cairnqd.config import Config

OTHER_QUEUE = "_other"
#: Unconfigured queues that keep their own label value before `_other` takes over.
MAX_UNKNOWN_QUEUES = 20

FAILURE_REASONS = ("error", "max_run", "worker_lost", "lease_lost", "undecodable")
RECOVERY_REASONS = ("expired", "worker_exit", "shutdown", "max_run")
CHILD_STATES = ("starting", "ready", "draining", "backoff")
GROUP_STATES = ("running", "crashloop", "fatal")
RESTART_REASONS = (
    "crash",
    "signal",
    "heartbeat_timeout",
    "stall",
    "boot_failure",
    "max_run",
    "cancel",
    "max_tasks",
    "max_memory",
    "reload",
)
DB_ERROR_COMPONENTS = ("child", "maintenance", "listener", "scheduler")
DB_ERROR_KINDS = ("busy", "timeout", "connect", "full", "other")

#: Every family the daemon exports, as a scrape exposes it (counters with `_total`).
#: monitoring/ and its tests are held to this list.
METRIC_NAMES: tuple[str, ...] = (
    "cairnq_tasks",
    "cairnq_tasks_waiting",
    "cairnq_queue_oldest_queued_age_seconds",
    "cairnq_leases_expired",
    "cairnq_queue_paused",
    "cairnq_fleet_daemons",
    "cairnq_limit_in_use",
    "cairnq_limit_capacity",
    "cairnq_limit_waiting",
    "cairnq_limit_bypassed",
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
    "cairnq_child_tasks",
    "cairnq_child_loop_lag_seconds",
    "cairnq_child_listen_deaf",
    "cairnq_listen_deaf",
    "cairnq_purge_deleted_total",
    "cairnq_purge_runs_total",
    "cairnq_purge_failures_total",
    "cairnq_purge_last_success_timestamp_seconds",
    "cairnq_config_last_reload_successful",
    "cairnq_config_last_reload_success_timestamp_seconds",
    "cairnq_config_generation",
    "cairnq_build_info",
    "cairnq_schedule_last_fire_timestamp_seconds",
    "cairnq_schedule_next_fire_timestamp_seconds",
    "cairnq_schedule_period_seconds",
    "cairnq_schedule_fired_total",
    "cairnq_schedule_misfires_total",
    "cairnq_schedule_enqueue_failures_total",
    "cairnq_scheduler_leader",
)


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


def configured_queues(config: Config) -> list[str]:
    return sorted({q for group in config.groups.values() for q in group.queues})


def check_enum(what: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(allowed)}; got {value!r}")
