"""The parent's Prometheus registry, its HTTP endpoint and the database collector.

Design note. The parent owns the only registry; children report on their
event pipe and `record_event` turns each line into counter updates here, so counters
survive child restarts and no multiprocess mode (with its per-pid files) is needed.

- `registry`: `Metrics`, every family and the updates the supervisor makes; the
  families themselves are declared in `families`.
- `database`: the DB gauges, a collector with its own thread, store, cache and
  (`metrics.queue_stats: leader`) leader lock.
- `labels`: family names and the bounded label values (queues, enums).
- `series`: which label values are in use, so reload can drop a queue's series.
- `server`: `/metrics` and `/healthz`.
"""

from __future__ import annotations

from cairnqd.daemon.parent.metrics.database import DatabaseCollector, DatabaseSnapshot
from cairnqd.daemon.parent.metrics.labels import (
    CHILD_STATES,
    DB_ERROR_KINDS,
    FAILURE_REASONS,
    GROUP_STATES,
    METRIC_NAMES,
    OTHER_QUEUE,
    RECOVERY_REASONS,
    RESTART_REASONS,
    QueueLabels,
)
from cairnqd.daemon.parent.metrics.registry import Metrics

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
