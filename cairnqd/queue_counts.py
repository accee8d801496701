"""Per-queue counters of finished tasks: what the dashboard charts over an hour, a day
or a week without reading the task table.

A worker tallies in memory, per minute, queue and series, how many of its attempts
ended with each outcome (succeeded, failed, retried, canceled, lease_lost) as a
histogram of their run times, and how long its tasks waited from being due to their
start (series `wait`). Every few seconds it adds the tallies to `cairnqd_queue_counts`
at three widths (a minute, a quarter of an hour, an hour), so that a chart of any range
reads a bounded number of rows, and rows written by many workers add up.

Buckets: a histogram's bin of a duration in whole milliseconds. 0-3 ms have a bin
each; above, each power of two is cut in four, so a bin is at most a quarter of its
lower bound wide and a percentile read from the bins is within about 12% of the truth.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

#: The widths of the periods kept, in seconds, and how far back each is kept: the
#: minutes for the hour chart, quarter hours for the day, hours for the week.
WIDTHS_S = (60, 900, 3600)
KEEP_MS = {60: 2 * 3_600_000, 900: 2 * 86_400_000, 3600: 8 * 86_400_000}
#: The outcomes a worker reports for an attempt (WorkerObserver.task_ended's).
OUTCOMES = ("succeeded", "failed", "retried", "canceled", "lease_lost")
WAIT = "wait"
#: A worker adds its tallies this often (and when it stops).
FLUSH_EVERY_S = 10.0
#: Minutes of tallies a worker keeps while the database refuses them; older ones are
#: dropped first, so a long outage costs the counts of its start, not memory.
MAX_PENDING_MINUTES = 180


def bucket_of(ms: int) -> int:
    """The bin of a duration of `ms` milliseconds (negative counts as 0)."""
    if ms < 4:
        return ms if ms > 0 else 0
    e = ms.bit_length() - 1  # 2 or more: ms lies in [2**e, 2**(e+1))
    return 4 * (e - 1) + ((ms >> (e - 2)) & 3)


def bucket_bounds(bucket: int) -> tuple[int, int]:
    """The durations, in ms, of bin `bucket`: from the first included to the last excluded."""
    if bucket < 4:
        return bucket, bucket + 1
    e, m = divmod(bucket, 4)
    return (4 + m) << (e - 1), (5 + m) << (e - 1)


def _middle(bucket: int) -> float:
    lo, hi = bucket_bounds(bucket)
    return lo if hi - lo == 1 else (lo + hi) / 2


def percentiles(bins: Mapping[int, int], qs: Sequence[float]) -> list[float | None]:
    """The quantiles `qs` (ascending, each 0 < q <= 1), in ms, of a histogram {bin:
    count}: the middle of the bin each falls in; all None for an empty histogram."""
    total = sum(bins.values())
    if total <= 0:
        return [None] * len(qs)
    found: list[float | None] = []
    seen = 0
    ordered = sorted(bins)
    at = 0
    for q in qs:
        rank = q * total
        while at < len(ordered) - 1 and seen + bins[ordered[at]] < rank:
            seen += bins[ordered[at]]
            at += 1
        found.append(_middle(ordered[at]))
    return found


def percentile(bins: Mapping[int, int], q: float) -> float | None:
    """The `q` quantile of a histogram, as `percentiles` reads it."""
    return percentiles(bins, (q,))[0]


class CountRow(NamedTuple):
    """One row of `cairnqd_queue_counts`: `n` events of `series` in bin `bucket`, in
    the `width_s` period of `queue` that began at `start_ms`. A tuple: a week's chart
    reads tens of thousands of them."""

    width_s: int
    start_ms: int
    queue: str
    series: str
    bucket: int
    n: int


Key = tuple[int, str, str, int]  # (minute start ms, queue, series, bucket)


class QueueTally:
    """A worker's counts not yet written, per minute. Not thread-safe: the worker's
    event loop is its only user."""

    def __init__(self) -> None:
        self._counts: dict[Key, int] = {}

    def __len__(self) -> int:
        return len(self._counts)

    def add(self, queue: str, series: str, ms: float, now_ms: int | None = None) -> None:
        """Count one event of `series` lasting `ms` milliseconds, in the current minute."""
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        key = (now_ms - now_ms % 60_000, queue, series, bucket_of(int(ms)))
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1

    def take(self) -> dict[Key, int]:
        """Everything counted so far, which the tally forgets."""
        counts, self._counts = self._counts, {}
        return counts

    def give_back(self, counts: Mapping[Key, int]) -> None:
        """Counts a write did not take, to be written with the next ones; past
        `MAX_PENDING_MINUTES` distinct minutes, the oldest are dropped."""
        for key, n in counts.items():
            self._counts[key] = self._counts.get(key, 0) + n
        minutes = sorted({key[0] for key in self._counts})
        if len(minutes) > MAX_PENDING_MINUTES:
            cut = minutes[-MAX_PENDING_MINUTES]
            self._counts = {k: n for k, n in self._counts.items() if k[0] >= cut}


def rows_of(counts: Mapping[Key, int]) -> list[CountRow]:
    """Minute tallies as the rows to add at every width, summed per row."""
    rows: dict[tuple[int, int, str, str, int], int] = {}
    for (minute_ms, queue, series, bucket), n in counts.items():
        for width in WIDTHS_S:
            start = minute_ms - minute_ms % (width * 1000)
            key = (width, start, queue, series, bucket)
            rows[key] = rows.get(key, 0) + n
    return [CountRow(*key, n) for key, n in sorted(rows.items())]


@dataclass
class Period:
    """One bar of a queue's chart: the counts and histograms of one period."""

    start_ms: int
    outcomes: dict[str, int]
    wait: dict[int, int]
    run: dict[int, int]

    @property
    def finished(self) -> int:
        return self.outcomes.get("succeeded", 0)

    @property
    def failed(self) -> int:
        return self.outcomes.get("failed", 0)


def periods_by_queue(
    rows: Iterable[CountRow], first_ms: int, width_s: int, count: int
) -> dict[str, list[Period]]:
    """Rows read back as `count` periods per queue from `first_ms` on (empty periods
    included, so every queue's chart has the same bars). Run times are those of
    attempts that ran to an end: succeeded, failed or retried."""
    width_ms = width_s * 1000
    charts: dict[str, list[Period]] = {}
    for row in rows:
        index = (row.start_ms - first_ms) // width_ms
        if not 0 <= index < count:
            continue
        bars = charts.get(row.queue)
        if bars is None:
            bars = charts[row.queue] = [
                Period(first_ms + i * width_ms, {}, {}, {}) for i in range(count)
            ]
        bar = bars[index]
        if row.series == WAIT:
            bar.wait[row.bucket] = bar.wait.get(row.bucket, 0) + row.n
            continue
        bar.outcomes[row.series] = bar.outcomes.get(row.series, 0) + row.n
        if row.series in ("succeeded", "failed", "retried"):
            bar.run[row.bucket] = bar.run.get(row.bucket, 0) + row.n
    return charts


def merged(bins: Iterable[Mapping[int, int]]) -> dict[int, int]:
    """Histograms added up."""
    total: dict[int, int] = {}
    for one in bins:
        for bucket, n in one.items():
            total[bucket] = total.get(bucket, 0) + n
    return total


__all__ = [
    "FLUSH_EVERY_S",
    "KEEP_MS",
    "OUTCOMES",
    "WAIT",
    "WIDTHS_S",
    "CountRow",
    "Period",
    "QueueTally",
    "bucket_bounds",
    "bucket_of",
    "merged",
    "percentile",
    "percentiles",
    "periods_by_queue",
    "rows_of",
]
