"""A histogram fed with bucket counts rather than single observations.

Children send their task durations and queue waits already bucketed (see
`daemon.tally`); prometheus_client's `Histogram` only takes one observation at a time,
so these two families are exposed by this small collector instead. Its children offer
`labels()`/`remove()` like a prometheus_client metric, so the series book can drop a
queue's series on reload the same way.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector


class BucketSeries:
    """One label combination: per-bucket counts (not cumulative, +Inf last) and sum."""

    def __init__(self, buckets: int, lock: threading.Lock) -> None:
        self._lock = lock
        self.counts = [0] * buckets
        self.total = 0.0

    def add(self, counts: Sequence[int], total: float) -> None:
        if len(counts) != len(self.counts):
            raise ValueError(f"expected {len(self.counts)} bucket counts, got {len(counts)}")
        with self._lock:
            for index, n in enumerate(counts):
                self.counts[index] += n
            self.total += total

    def observe(self, value: float, bounds: Sequence[float]) -> None:
        """One observation (the parent's own, e.g. in tests)."""
        counts = [0] * len(self.counts)
        counts[next((i for i, b in enumerate(bounds) if value <= b), len(bounds))] += 1
        self.add(counts, value)


class BucketHistogram(Collector):
    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(float(b) for b in buckets if not math.isinf(b))
        self._lock = threading.Lock()
        self._series: dict[tuple[str, ...], BucketSeries] = {}

    def labels(self, *values: str) -> BucketSeries:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        with self._lock:
            series = self._series.get(values)
            if series is None:
                series = self._series[values] = BucketSeries(len(self.bounds) + 1, self._lock)
            return series

    def remove(self, *values: str) -> None:
        with self._lock:
            del self._series[values]

    def describe(self) -> Iterable[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterable[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        with self._lock:
            snapshot = [(values, list(s.counts), s.total) for values, s in self._series.items()]
        for values, counts, total in snapshot:
            cumulative, running = [], 0
            for bound, n in zip((*self.bounds, math.inf), counts, strict=True):
                running += n
                cumulative.append((_bound_text(bound), running))
            family.add_metric(list(values), cumulative, total)
        return [family]


def _bound_text(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))
