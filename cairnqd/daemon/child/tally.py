"""Task counts a child keeps and the parent turns into metrics, without a message per task.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from cairnqd.daemon.wire.messages import CounterKey, Tally, TallyCount
from cairnqd.errors import UndecodableRow

#: The error code of a row failed because it could not be decoded (`store.base`).
UNDECODABLE_CODE = UndecodableRow.CODE


def failure_reason(outcome: str, code: str) -> str:
    """Map an attempt's outcome and error code onto the bounded `reason` label."""
    if outcome == "lease_lost":
        return "lease_lost"
    if code.startswith("max_run") or code == "handler_timeout":
        return "max_run"
    if code in ("lease_expired", "worker_lost"):
        return "worker_lost"
    if code == UNDECODABLE_CODE:
        return "undecodable"
    return "error"


class Histogram:
    """Cumulative bucket counts and the sum of what was observed. Hot callers (the
    child's observer) update `counts` and `total` in place, as `observe` does."""

    __slots__ = ("bounds", "counts", "first", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = list(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.total = 0.0
        #: The first bucket's bound (+Inf without buckets): a value at or below it is
        #: counted without a bisect.
        self.first = self.bounds[0] if self.bounds else math.inf

    def observe(self, value: float) -> None:
        """Count `value` (a negative one, from clock skew, as 0)."""
        if value < 0.0:
            value = 0.0
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value


class Counts:
    """The counts of one task name in one queue, with its queue's two histograms (shared
    by the queue's names), so a caller that keeps this one object per task counts
    everything through it. The common outcomes are fields; the failures, rarer, are
    counted by (kind, reason)."""

    __slots__ = ("canceled", "durations", "others", "started", "succeeded", "waits")

    def __init__(self, durations: Histogram, waits: Histogram) -> None:
        self.durations = durations
        self.waits = waits
        self.started = 0
        self.succeeded = 0
        self.canceled = 0
        self.others: dict[tuple[str, str], int] = {}

    def count_end(self, outcome: str, code: str) -> None:
        """An attempt that ended `outcome` (any but lease_lost before a start)."""
        if outcome == "succeeded":
            self.succeeded += 1
        elif outcome == "canceled":
            self.canceled += 1
        else:
            others = self.others
            key = ("failed", failure_reason(outcome, code))
            others[key] = others.get(key, 0) + 1
            if outcome == "retried":
                others[_RETRIED] = others.get(_RETRIED, 0) + 1


class _Queue:
    """One queue's names and its two histograms."""

    __slots__ = ("durations", "names", "waits")

    def __init__(self, duration_buckets: Sequence[float], wait_buckets: Sequence[float]) -> None:
        self.names: dict[str, Counts] = {}
        self.durations = Histogram(duration_buckets)
        self.waits = Histogram(wait_buckets)


class TaskTally:
    """A child's cumulative task counts (event-loop thread only).

    Counting runs for every task, at up to ~10k a second per child, so it does little:
    a field increment and a bisect, on the `Counts` the caller keeps per task (found
    once by two strings: no tuple key is built). `counters` and `snapshot` do the
    reshaping, a few times a second."""

    def __init__(self, duration_buckets: Sequence[float], wait_buckets: Sequence[float]) -> None:
        self._buckets = (list(duration_buckets), list(wait_buckets))
        self._queues: dict[str, _Queue] = {}

    def counts(self, queue: str, name: str) -> Counts:
        """The counts of `name` in `queue`, made on first use."""
        counts = self._queues.get(queue)
        if counts is None:
            counts = self._queues[queue] = _Queue(*self._buckets)
        named = counts.names.get(name)
        if named is None:
            named = counts.names[name] = Counts(counts.durations, counts.waits)
        return named

    def started(self, queue: str, name: str, wait_s: float) -> None:
        """A start of `name` in `queue`, claimed `wait_s` after it was due."""
        named = self.counts(queue, name)
        named.waits.observe(wait_s)
        named.started += 1

    def ended(self, queue: str, name: str, outcome: str, code: str, duration_s: float) -> None:
        named = self.counts(queue, name)
        named.count_end(outcome, code)
        named.durations.observe(duration_s)

    @property
    def counters(self) -> dict[CounterKey, int]:
        """Every non-zero count by (queue, name, kind, reason)."""
        found: dict[CounterKey, int] = {}
        for queue, counts in self._queues.items():
            for name, named in counts.names.items():
                for kind, n in (
                    ("started", named.started),
                    ("succeeded", named.succeeded),
                    ("canceled", named.canceled),
                ):
                    if n:
                        found[(queue, name, kind, "")] = n
                for (kind, reason), n in named.others.items():
                    found[(queue, name, kind, reason)] = n
        return found

    def snapshot(self) -> Tally:
        """The counts so far, as the `tally` message carries them."""
        queues = self._queues.items()
        return Tally(
            counts=tuple(TallyCount(*key, n) for key, n in self.counters.items()),
            durations={q: (*c.durations.counts, c.durations.total) for q, c in queues},
            waits={q: (*c.waits.counts, c.waits.total) for q, c in queues},
        )


_RETRIED = ("retried", "")
