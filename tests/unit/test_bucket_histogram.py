"""BucketHistogram exposes bucket counts exactly as prometheus_client's Histogram would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from cairnqd.daemon.parent.metrics.buckets import BucketHistogram

BOUNDS = (0.005, 0.1, 1.0, 10.0)
VALUES = (0.001, 0.005, 0.05, 0.5, 0.5, 2.0, 99.0)


def _scrape(collector: object) -> list[str]:
    registry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]
    return [
        line
        for line in generate_latest(registry).decode().splitlines()
        if line.startswith("cairnq_x") and "_created" not in line
    ]


def test_same_exposition_as_a_real_histogram() -> None:
    reference = Histogram("cairnq_x", "x", ["queue"], buckets=BOUNDS, registry=None)
    ours = BucketHistogram("cairnq_x", "x", ["queue"], BOUNDS)
    for value in VALUES:
        reference.labels("q").observe(value)
    # Delivered as two bucketed batches, the way children send them.
    counts = [0] * (len(BOUNDS) + 1)
    for value in VALUES[:3]:
        ours.labels("q").observe(value, BOUNDS)
    for value in VALUES[3:]:
        counts[next((i for i, b in enumerate(BOUNDS) if value <= b), len(BOUNDS))] += 1
    ours.labels("q").add(counts, sum(VALUES[3:]))
    assert _scrape(ours) == _scrape(reference)


def test_removed_series_disappear() -> None:
    ours = BucketHistogram("cairnq_x", "x", ["queue"], BOUNDS)
    ours.labels("a").observe(1.0, BOUNDS)
    ours.labels("b").observe(1.0, BOUNDS)
    ours.remove("a")
    lines = _scrape(ours)
    assert lines and all('queue="b"' in line for line in lines)
