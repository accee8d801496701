"""The parent's side of the children's tallies (daemon/child/tally.py): each child's
last cumulative tally, and what changed since, as counter and histogram deltas.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from cairnqd.daemon.wire.messages import TALLY_KINDS, CounterKey, Tally, TallyCount


@dataclass(frozen=True)
class CounterDelta:
    queue: str
    name: str
    kind: str
    reason: str
    amount: int


@dataclass(frozen=True)
class HistogramDelta:
    which: str  # "durations" or "waits"
    queue: str
    counts: tuple[int, ...]  # per bucket, +Inf last
    total: float


class TallyBook:
    """The parent's memory of each child's last tally, to turn the next into deltas."""

    def __init__(self) -> None:
        self._last: dict[str, Tally] = {}

    def forget(self, child: str) -> None:
        self._last.pop(child, None)

    def apply(self, child: str, tally: Tally) -> tuple[list[CounterDelta], list[HistogramDelta]]:
        """What changed since `child`'s previous tally. ValueError on a tally whose
        counts are not counts (the caller's guard counts it and moves on)."""
        previous = self._last.get(child)
        before = {} if previous is None else {_key(c): c.n for c in previous.counts}
        counters = []
        for count in tally.counts:
            if count.what not in TALLY_KINDS or count.n < 0:
                raise ValueError(f"bad tally count {count!r}")
            amount = count.n - before.get(_key(count), 0)
            if amount > 0:
                counters.append(
                    CounterDelta(count.queue, count.name, count.what, count.reason, amount)
                )
        durations, waits = (previous.durations, previous.waits) if previous else ({}, {})
        histograms = [
            *_histogram_deltas("durations", durations, tally.durations),
            *_histogram_deltas("waits", waits, tally.waits),
        ]
        self._last[child] = tally
        return counters, histograms


def _key(count: TallyCount) -> CounterKey:
    return (count.queue, count.name, count.what, count.reason)


def _histogram_deltas(
    which: str,
    before: Mapping[str, tuple[float, ...]],
    now: Mapping[str, tuple[float, ...]],
) -> Iterator[HistogramDelta]:
    for queue, values in now.items():
        if len(values) < 2:
            raise ValueError(f"bad tally histogram for {queue!r}")
        counts = [int(v) for v in values[:-1]]
        total = float(values[-1])
        old = before.get(queue)
        if old is not None:
            counts = [c - int(o) for c, o in zip(counts, old[:-1], strict=True)]
            total -= float(old[-1])
        if any(counts):
            yield HistogramDelta(which, queue, tuple(counts), total)
