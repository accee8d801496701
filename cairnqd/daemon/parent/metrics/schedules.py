"""The schedule families: per configured schedule, when it last fired and fires next, its
period (what an alert compares the silence with), and what this host enqueued, gave up
or failed to enqueue.

The times come from the database, so every host exports the same last and next fire
times whichever one leads (aggregate them with max); the counters are this host's.
Label values are schedule names from the config; a schedule removed by a reload has
its series removed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["ScheduleFamilies"]


class ScheduleFamilies:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self._lock = threading.Lock()
        self._known: set[str] = set()
        self.last_fire = Gauge(
            "cairnq_schedule_last_fire_timestamp_seconds",
            "Unix time a schedule last enqueued a task (any host; manual runs too), or when "
            "this host first saw it.",
            ["schedule"],
            registry=r,
        )
        self.next_fire = Gauge(
            "cairnq_schedule_next_fire_timestamp_seconds",
            "Unix time of a schedule's next slot (enabled schedules only).",
            ["schedule"],
            registry=r,
        )
        self.period = Gauge(
            "cairnq_schedule_period_seconds",
            "Time between a schedule's next two slots (enabled schedules only).",
            ["schedule"],
            registry=r,
        )
        self.fired = Counter(
            "cairnq_schedule_fired_total",
            "Slots this host enqueued a task for.",
            ["schedule"],
            registry=r,
        )
        self.misfires = Counter(
            "cairnq_schedule_misfires_total",
            "Missed slots this host gave up under the schedule's misfire policy.",
            ["schedule"],
            registry=r,
        )
        self.enqueue_failures = Counter(
            "cairnq_schedule_enqueue_failures_total",
            "Attempts to enqueue a slot's task that failed (the slot stays due).",
            ["schedule"],
            registry=r,
        )
        self.leader = Gauge(
            "cairnq_scheduler_leader",
            "1 while this host runs the schedules (Postgres: holds the scheduler lock).",
            registry=r,
        )

    def _per_schedule(self) -> tuple[Gauge | Counter, ...]:
        return (
            self.last_fire,
            self.next_fire,
            self.period,
            self.fired,
            self.misfires,
            self.enqueue_failures,
        )

    def configure(self, names: Iterable[str]) -> None:
        """Start the counters of new schedules at 0; drop a removed one's series."""
        wanted = set(names)
        with self._lock:
            for gone in self._known - wanted:
                for family in self._per_schedule():
                    with contextlib.suppress(KeyError):
                        family.remove(gone)
            for name in wanted - self._known:
                for counter in (self.fired, self.misfires, self.enqueue_failures):
                    counter.labels(name)
            self._known = wanted

    def set_times(
        self, name: str, last_fire: float, next_fire: float | None, period_s: float | None
    ) -> None:
        with self._lock:
            if name not in self._known:
                return  # removed by a reload while this update was on its way
            self.last_fire.labels(name).set(last_fire)
            for gauge, value in ((self.next_fire, next_fire), (self.period, period_s)):
                if value is None:
                    with contextlib.suppress(KeyError):
                        gauge.remove(name)
                else:
                    gauge.labels(name).set(value)

    def count(self, family: Counter, name: str, n: int = 1) -> None:
        with self._lock:
            if name in self._known:
                family.labels(name).inc(n)
