"""Task tallies: cumulative in the child, deltas in the parent, any tally may be lost."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cairnqd.daemon.child.tally import TaskTally, failure_reason
from cairnqd.daemon.parent.metrics.tallies import TallyBook
from cairnqd.daemon.wire.messages import Tally, TallyCount, decode_child, encode

BUCKETS = (0.1, 1.0)


def test_deltas_survive_a_lost_tally() -> None:
    tally, book = TaskTally(BUCKETS, BUCKETS), TallyBook()
    tally.started("q", "a", 0.05)
    tally.ended("q", "a", "succeeded", "", 0.5)
    first = decode_child(encode(tally.snapshot()))  # it travels as a message
    assert isinstance(first, Tally)
    counters, histograms = book.apply("child-1", first)
    assert sorted((c.kind, c.amount) for c in counters) == [("started", 1), ("succeeded", 1)]
    assert {(h.which, h.counts) for h in histograms} == {
        ("durations", (0, 1, 0)),
        ("waits", (1, 0, 0)),
    }
    tally.started("q", "a", 2.0)
    tally.ended("q", "a", "retried", "handler_error", 3.0)
    tally.snapshot()  # this one is lost on the way
    tally.started("q", "a", 0.0)
    tally.ended("q", "a", "failed", "max_run_exceeded", 0.01)
    counters, histograms = book.apply("child-1", tally.snapshot())
    assert sorted((c.kind, c.reason, c.amount) for c in counters) == [
        ("failed", "error", 1),
        ("failed", "max_run", 1),
        ("retried", "", 1),
        ("started", "", 2),
    ]
    durations = next(h for h in histograms if h.which == "durations")
    assert durations.counts == (1, 0, 1) and durations.total == pytest.approx(3.01)


def test_a_new_child_starts_from_zero() -> None:
    tally, book = TaskTally(BUCKETS, BUCKETS), TallyBook()
    tally.started("q", "a", 0.0)
    book.apply("child-1", tally.snapshot())
    book.forget("child-1")
    counters, _ = book.apply("child-1", tally.snapshot())
    assert [(c.kind, c.amount) for c in counters] == [("started", 1)]


def test_a_malformed_tally_is_refused() -> None:
    with pytest.raises(ValueError, match="bad tally count"):
        TallyBook().apply("c", Tally((TallyCount("q", "n", "exploded", "", 1),), {}, {}))


@pytest.mark.parametrize(
    ("outcome", "code", "reason"),
    [
        ("lease_lost", "anything", "lease_lost"),
        ("failed", "max_run_exceeded", "max_run"),
        ("retried", "handler_timeout", "max_run"),
        ("failed", "lease_expired", "worker_lost"),
        ("failed", "bad_order", "error"),
        ("failed", "undecodable_row", "undecodable"),
    ],
)
def test_failure_reasons_are_bounded(outcome: str, code: str, reason: str) -> None:
    assert failure_reason(outcome, code) == reason


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["q1", "q2"]),
            st.sampled_from(["succeeded", "retried", "failed", "canceled", "lease_lost"]),
            st.floats(0, 5),
            st.booleans(),
        ),
        max_size=60,
    )
)
def test_summed_deltas_equal_the_totals(events: list[tuple[str, str, float, bool]]) -> None:
    tally, book = TaskTally(BUCKETS, BUCKETS), TallyBook()
    summed: dict[tuple[str, str, str], int] = {}
    for queue, outcome, seconds, send in events:
        tally.started(queue, "n", seconds)
        tally.ended(queue, "n", outcome, "", seconds)
        if send:
            for c in book.apply("c", tally.snapshot())[0]:
                key = (c.queue, c.kind, c.reason)
                summed[key] = summed.get(key, 0) + c.amount
    for c in book.apply("c", tally.snapshot())[0]:
        key = (c.queue, c.kind, c.reason)
        summed[key] = summed.get(key, 0) + c.amount
    expected = {(q, k, r): n for (q, _, k, r), n in tally.counters.items()}
    assert summed == expected
