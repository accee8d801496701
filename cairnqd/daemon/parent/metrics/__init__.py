"""The parent's Prometheus registry, its HTTP endpoint and the database collector.

The reasoning: docs/architecture.md, "Daemon design notes".
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
