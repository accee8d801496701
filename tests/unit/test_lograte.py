"""_lograte: a flood of alike records keeps a few lines and counts the rest, and
never holds back a record for good (a property, over any sequence of events)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cairnqd._lograte import Burst, Repeats


def test_repeats_logs_a_kind_once_per_interval_with_the_count() -> None:
    now = [0.0]
    repeats = Repeats(every_s=30.0, clock=lambda: now[0])
    assert repeats.admit("claim: full") == 0
    assert repeats.admit("claim: full") is None
    assert repeats.admit("heartbeat: full") == 0  # another kind is not held back
    now[0] = 10.0
    assert repeats.admit("claim: full") is None
    now[0] = 30.0
    assert repeats.admit("claim: full") == 2
    assert repeats.admit("claim: full") is None


def test_repeats_forgets_old_kinds_rather_than_grow() -> None:
    now = [0.0]
    repeats = Repeats(every_s=1.0, clock=lambda: now[0])
    for i in range(Repeats.MAX_KINDS):
        repeats.admit(i)
    now[0] = 2.0
    assert repeats.admit("new") == 0
    assert len(repeats._seen) == 1
    now[0] = 2.5  # all fresh now: past the cap everything is forgotten
    for i in range(Repeats.MAX_KINDS):
        repeats.admit(("again", i))
    assert len(repeats._seen) <= Repeats.MAX_KINDS


def test_burst_admits_a_few_per_window_and_counts_the_rest() -> None:
    now = [0.0]
    burst = Burst(burst=2, window_s=10.0, clock=lambda: now[0])
    assert [burst.admit() for _ in range(5)] == [0, 0, None, None, None]
    now[0] = 10.0
    assert burst.admit() == 3
    assert burst.admit() == 0
    assert burst.admit() is None


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 40)), max_size=60))
def test_repeats_accounts_for_every_event(events: list[tuple[str, int]]) -> None:
    # Each event is logged or counted in the next record of its kind; after a final
    # round past the interval, logged + counted == events, kind by kind.
    now = [0.0]
    repeats = Repeats(every_s=30.0, clock=lambda: now[0])
    logged: dict[str, int] = {}
    counted: dict[str, int] = {}
    for kind, step in events:
        now[0] += step
        held = repeats.admit(kind)
        if held is not None:
            logged[kind] = logged.get(kind, 0) + 1
            counted[kind] = counted.get(kind, 0) + held
    now[0] += 30.0
    for kind in "abc":
        held = repeats.admit(kind)
        assert held is not None
        counted[kind] = counted.get(kind, 0) + held
    for kind in "abc":
        sent = sum(1 for k, _ in events if k == kind)
        assert logged.get(kind, 0) + counted[kind] == sent
