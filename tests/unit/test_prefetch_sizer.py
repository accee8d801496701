"""`PrefetchSizer`: how many tasks `auto` claims ahead, from the handlers' pace."""

from __future__ import annotations

import pytest

from cairnqd._prefetch import PrefetchSizer, check_prefetch


def test_a_fixed_count_is_used_as_is() -> None:
    sizer = PrefetchSizer(32)
    sizer.observe(10.0)
    assert sizer.target(8, longest_running_s=60.0) == 32
    assert PrefetchSizer(0).target(8) == 0


def test_auto_claims_nothing_ahead_before_any_call_has_finished() -> None:
    assert PrefetchSizer("auto").target(8) == 0


def test_auto_sizes_the_backlog_to_the_horizon() -> None:
    sizer = PrefetchSizer("auto")
    sizer.observe(0.01)  # 10 ms calls on 8 slots start 800/s: 40 fit in 50 ms
    assert sizer.target(8) == 40


def test_auto_is_capped_for_instant_handlers() -> None:
    sizer = PrefetchSizer("auto")
    sizer.observe(0.0)
    assert sizer.target(8) == PrefetchSizer.AUTO_MAX


def test_auto_claims_nothing_ahead_for_slow_handlers() -> None:
    sizer = PrefetchSizer("auto")
    sizer.observe(1.0)
    assert sizer.target(8) == 0


def test_auto_backs_off_while_a_call_runs_long() -> None:
    sizer = PrefetchSizer("auto")
    for _ in range(50):
        sizer.observe(0.0001)
    assert sizer.target(8) == PrefetchSizer.AUTO_MAX
    # One call in flight for 2 s says the mix has slow tasks: stop hoarding now,
    # not only once that call has finished.
    assert sizer.target(8, longest_running_s=2.0) == 0


def test_auto_follows_a_slowdown_within_ten_calls() -> None:
    sizer = PrefetchSizer("auto")
    for _ in range(50):
        sizer.observe(0.0001)
    for _ in range(10):
        sizer.observe(0.5)
    assert sizer.target(8) == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "Auto", None, "8"])
def test_check_prefetch_refuses_anything_else(bad: object) -> None:
    with pytest.raises(ValueError, match='prefetch must be "auto" or an integer >= 0'):
        check_prefetch(bad)
