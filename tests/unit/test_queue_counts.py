"""The per-queue counters' pure parts: histogram bins, percentiles, the rows a tally
becomes at every width, and the periods a chart reads back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cairnqd.queue_counts import (
    MAX_PENDING_MINUTES,
    WAIT,
    CountRow,
    QueueTally,
    bucket_bounds,
    bucket_of,
    percentile,
    periods_by_queue,
    rows_of,
)


@given(st.integers(min_value=0, max_value=1 << 45))
def test_every_duration_falls_in_its_bins_bounds(ms: int) -> None:
    lo, hi = bucket_bounds(bucket_of(ms))
    assert lo <= ms < hi
    # A bin is at most a quarter of its lower bound wide past the exact small ones.
    assert hi - lo <= max(1, lo // 4)


@given(st.integers(min_value=0, max_value=1 << 40), st.integers(min_value=0, max_value=1 << 40))
def test_bins_keep_the_order_of_durations(a: int, b: int) -> None:
    if a <= b:
        assert bucket_of(a) <= bucket_of(b)


def test_negative_durations_count_as_zero() -> None:
    assert bucket_of(-5) == 0


@given(st.lists(st.integers(min_value=0, max_value=10_000_000), min_size=1, max_size=300))
def test_a_percentile_is_within_its_bin_of_the_true_one(values: list[int]) -> None:
    bins: dict[int, int] = {}
    for v in values:
        bins[bucket_of(v)] = bins.get(bucket_of(v), 0) + 1
    ordered = sorted(values)
    for q in (0.5, 0.95, 0.99):
        truth = ordered[max(0, -(-int(q * len(values) * 1000) // 1000) - 1)]
        got = percentile(bins, q)
        assert got is not None
        lo, hi = bucket_bounds(bucket_of(truth))
        assert lo <= got <= hi


def test_an_empty_histogram_has_no_percentile() -> None:
    assert percentile({}, 0.5) is None


def test_a_tally_becomes_rows_at_every_width_summed() -> None:
    tally = QueueTally()
    minute = 1_699_999_200_000  # an hour boundary
    tally.add("mail", "succeeded", 12, minute + 5_000)
    tally.add("mail", "succeeded", 13, minute + 65_000)  # the next minute, same bin
    tally.add("mail", WAIT, 2, minute + 5_000)
    rows = rows_of(tally.take())
    assert len(tally) == 0
    by_width: dict[int, list[CountRow]] = {}
    for r in rows:
        by_width.setdefault(r.width_s, []).append(r)
    assert sorted(r.n for r in by_width[60] if r.series == "succeeded") == [1, 1]
    # Both minutes fall in one quarter hour and one hour here: their bins add up.
    for width in (900, 3600):
        done = [r for r in by_width[width] if r.series == "succeeded"]
        assert [(r.n, r.bucket) for r in done] == [(2, bucket_of(12))]
        assert all(r.start_ms % (width * 1000) == 0 for r in by_width[width])


def test_counts_given_back_are_kept_for_a_bounded_number_of_minutes() -> None:
    tally = QueueTally()
    for minute in range(MAX_PENDING_MINUTES + 20):
        tally.add("q", "failed", 1, minute * 60_000)
    tally.give_back(tally.take())
    kept = {key[0] for key in tally.take()}
    assert len(kept) == MAX_PENDING_MINUTES
    assert min(kept) == 20 * 60_000  # the oldest were dropped


def test_periods_fill_every_bar_and_split_outcomes_from_waits() -> None:
    first = 600_000
    rows = [
        CountRow(60, first, "a", "succeeded", bucket_of(10), 3),
        CountRow(60, first + 120_000, "a", "failed", bucket_of(100), 1),
        CountRow(60, first + 120_000, "a", "canceled", 0, 1),
        CountRow(60, first + 120_000, "a", WAIT, bucket_of(5), 2),
        CountRow(60, first - 60_000, "a", "succeeded", 0, 9),  # before the range
    ]
    [(queue, bars)] = periods_by_queue(rows, first, 60, 3).items()
    assert queue == "a" and [b.start_ms for b in bars] == [first, first + 60_000, first + 120_000]
    assert [(b.finished, b.failed) for b in bars] == [(3, 0), (0, 0), (0, 1)]
    assert bars[2].outcomes["canceled"] == 1 and bars[2].run == {bucket_of(100): 1}
    assert bars[2].wait == {bucket_of(5): 2}


@given(st.integers(min_value=0, max_value=400))
def test_every_bin_number_has_bounds_its_durations_fall_in(bucket: int) -> None:
    """Bins are numbered without gaps, so any stored bin reads back (a row another
    writer made included)."""
    lo, hi = bucket_bounds(bucket)
    assert 0 <= lo < hi
    assert bucket_of(lo) == bucket == bucket_of(hi - 1)
