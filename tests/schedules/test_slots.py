"""Slot computation with the time passed in: every cron form, every:, time zones, both
DST changes and the misfire policies across simulated downtime. Nothing here sleeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import islice, pairwise
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cairnqd.schedules import CronSlots, EverySlots, Misfire, parse_cron, plan_due
from cairnqd.schedules.slots import from_ms, to_ms

NY = ZoneInfo("America/New_York")
# 2026 in New York: clocks jump 02:00 -> 03:00 on March 8, fall 02:00 -> 01:00 on Nov 1.
SPRING = datetime(2026, 3, 7, 12, 0, tzinfo=NY)
FALL = datetime(2026, 10, 31, 12, 0, tzinfo=NY)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def local(slots: list[datetime], zone: ZoneInfo = NY) -> list[str]:
    return [s.astimezone(zone).strftime("%m-%d %H:%M%z") for s in slots]


# -- cron forms -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "start", "expected"),
    [
        ("* * * * *", utc(2026, 1, 1, 0, 0, 30), ["00:01", "00:02", "00:03"]),
        ("*/15 * * * *", utc(2026, 1, 1, 0, 0), ["00:15", "00:30", "00:45"]),
        ("5,35 * * * *", utc(2026, 1, 1, 0, 0), ["00:05", "00:35", "01:05"]),
        ("10-12 3 * * *", utc(2026, 1, 1, 0, 0), ["03:10", "03:11", "03:12"]),
        ("0 9-17/4 * * *", utc(2026, 1, 1, 0, 0), ["09:00", "13:00", "17:00"]),
        ("0 0 1 * *", utc(2026, 1, 15), ["02-01 00:00", "03-01 00:00", "04-01 00:00"]),
        ("0 0 * * MON", utc(2026, 1, 1), ["01-05 00:00", "01-12 00:00", "01-19 00:00"]),
        ("0 0 * JAN,JUL SUN", utc(2026, 1, 30), ["07-05 00:00", "07-12 00:00", "07-19 00:00"]),
        # Both day fields restricted: either matches (the 13th, or any Friday).
        ("0 0 13 * FRI", utc(2026, 2, 1), ["02-06 00:00", "02-13 00:00", "02-20 00:00"]),
        ("0 0 L * *", utc(2026, 1, 1), ["01-31 00:00", "02-28 00:00", "03-31 00:00"]),
        ("0 0 29 2 *", utc(2026, 1, 1), ["2028-02-29", "2032-02-29", "2036-02-29"]),
        ("@hourly", utc(2026, 1, 1, 0, 30), ["01:00", "02:00", "03:00"]),
        ("@daily", utc(2026, 1, 1, 0, 30), ["01-02 00:00", "01-03 00:00", "01-04 00:00"]),
        ("@midnight", utc(2026, 1, 1, 0, 30), ["01-02 00:00", "01-03 00:00", "01-04 00:00"]),
        ("@weekly", utc(2026, 1, 1), ["01-04 00:00", "01-11 00:00", "01-18 00:00"]),
        ("@monthly", utc(2026, 1, 1), ["02-01 00:00", "03-01 00:00", "04-01 00:00"]),
        ("@yearly", utc(2026, 1, 1), ["2027-01-01", "2028-01-01", "2029-01-01"]),
        ("@annually", utc(2026, 6, 1), ["2027-01-01", "2028-01-01", "2029-01-01"]),
    ],
)
def test_cron_forms_in_utc(expr: str, start: datetime, expected: list[str]) -> None:
    slots = CronSlots.parse(expr).next_n(start, 3)
    full = [s.strftime("%Y-%m-%d %H:%M") for s in slots]
    for got, want in zip(full, expected, strict=True):
        assert want in got, (expr, full, expected)
    assert all(s > start for s in slots)


def test_a_slot_is_strictly_after_the_start_and_at_or_before_includes_it() -> None:
    slots = CronSlots.parse("0 * * * *")
    on_the_hour = utc(2026, 1, 1, 5, 0)
    assert slots.next_after(on_the_hour) == utc(2026, 1, 1, 6, 0)
    assert next(slots.at_or_before(on_the_hour)) == on_the_hour
    assert next(slots.at_or_before(on_the_hour - timedelta(microseconds=1))) == utc(
        2026, 1, 1, 4, 0
    )


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("61 * * * *", "bad minute"),
        ("0 24 * * *", "bad hour"),
        ("0 0 32 * *", "bad day-of-month"),
        ("0 0 * 13 *", "bad month"),
        ("0 0 * * 8", "bad day-of-week"),
        ("* * * *", "expected 5 fields"),
        ("0 * * * * *", "seconds are not supported"),
        ("@reboot", "unknown macro"),
        ("every minute", "expected 5 fields"),
    ],
)
def test_bad_cron_is_refused_with_a_reason(expr: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_cron(expr)


# -- every: -----------------------------------------------------------------------------


def test_every_counts_from_the_epoch_on_every_host() -> None:
    slots = EverySlots(timedelta(minutes=90))
    first = slots.next_after(utc(2026, 1, 1, 0, 10))
    assert first == utc(2026, 1, 1, 1, 30)  # 2026-01-01 is day 20454: 20454 * 16 slots of 90m
    assert slots.next_n(first, 2) == [utc(2026, 1, 1, 3, 0), utc(2026, 1, 1, 4, 30)]
    assert list(islice(slots.at_or_before(first), 2)) == [first, utc(2026, 1, 1, 0, 0)]
    one_second = EverySlots(timedelta(seconds=1))
    assert one_second.next_after(utc(2026, 1, 1, 0, 0, 0) + timedelta(milliseconds=400)) == utc(
        2026, 1, 1, 0, 0, 1
    )
    assert one_second.count_between(utc(2026, 1, 1), utc(2026, 1, 1, 0, 1), cap=10**6) == 60
    assert one_second.grace == timedelta(seconds=1)
    assert EverySlots(timedelta(hours=1)).grace == timedelta(seconds=10)
    with pytest.raises(ValueError, match="at least 1s"):
        EverySlots(timedelta(milliseconds=500))


def test_ms_round_trip() -> None:
    t = utc(2026, 12, 1, 5, 0, 0)
    assert from_ms(to_ms(t)) == t
    assert to_ms(utc(1970, 1, 1, 0, 0, 1)) == 1000


# -- time zones and DST -------------------------------------------------------------------


def test_timezone_moves_the_wall_clock() -> None:
    tokyo = CronSlots.parse("0 9 * * *", "Asia/Tokyo")
    assert tokyo.next_after(utc(2025, 12, 31, 20)) == utc(2026, 1, 1, 0, 0)  # 09:00 +09:00
    kolkata = CronSlots.parse("0 * * * *", "Asia/Kolkata")  # +05:30: the hour is at :30 UTC
    assert kolkata.next_after(utc(2026, 1, 1)) == utc(2026, 1, 1, 0, 30)
    with pytest.raises(Exception, match="No time zone found"):
        CronSlots.parse("0 9 * * *", "Mars/Olympus")


def test_spring_forward_moves_a_missing_wall_time_to_the_end_of_the_gap() -> None:
    slots = CronSlots.parse("30 2 * * *", "America/New_York")
    assert local(slots.next_n(SPRING, 3)) == [
        "03-08 03:00-0400",  # 02:30 does not exist that night: fired once, at 03:00
        "03-09 02:30-0400",
        "03-10 02:30-0400",
    ]


def test_spring_forward_collapses_every_missing_time_into_one_firing() -> None:
    slots = CronSlots.parse("*/20 2,3 * * *", "America/New_York")
    assert local(slots.next_n(SPRING, 4)) == [
        "03-08 03:00-0400",  # 02:00, 02:20, 02:40 and 03:00 itself: one firing
        "03-08 03:20-0400",
        "03-08 03:40-0400",
        "03-09 02:00-0400",
    ]
    assert local(list(islice(slots.at_or_before(datetime(2026, 3, 8, 3, 30, tzinfo=NY)), 3))) == [
        "03-08 03:20-0400",
        "03-08 03:00-0400",
        "03-07 03:40-0500",
    ]


def test_fall_back_fires_a_repeated_wall_time_once() -> None:
    slots = CronSlots.parse("30 1 * * *", "America/New_York")
    assert local(slots.next_n(FALL, 2)) == ["11-01 01:30-0400", "11-02 01:30-0500"]
    hours = CronSlots.parse("*/30 1 * * *", "America/New_York")
    # cronsim alone would fire 01:00 and 01:30 twice: the hour is named, so once each.
    assert local(hours.next_n(FALL, 3)) == [
        "11-01 01:00-0400",
        "11-01 01:30-0400",
        "11-02 01:00-0500",
    ]
    # Asked from inside the second pass, the repeated times are already behind.
    second_pass = datetime(2026, 11, 1, 1, 10, tzinfo=NY, fold=1)
    assert local([hours.next_after(second_pass)]) == ["11-02 01:00-0500"]
    assert local(list(islice(hours.at_or_before(second_pass), 2))) == [
        "11-01 01:30-0400",
        "11-01 01:00-0400",
    ]


def test_hour_wildcards_follow_elapsed_time_across_both_changes() -> None:
    hourly = CronSlots.parse("@hourly", "America/New_York")
    spring = hourly.next_n(datetime(2026, 3, 8, 0, 30, tzinfo=NY), 3)
    assert local(spring) == ["03-08 01:00-0500", "03-08 03:00-0400", "03-08 04:00-0400"]
    assert spring[1] - spring[0] == timedelta(hours=1)  # one real hour: 02:00 never was
    fall = hourly.next_n(datetime(2026, 11, 1, 0, 30, tzinfo=NY), 3)
    assert local(fall) == ["11-01 01:00-0400", "11-01 01:00-0500", "11-01 02:00-0500"]
    assert {b - a for a, b in pairwise(fall)} == {timedelta(hours=1)}


def test_period_is_the_gap_between_the_next_two_slots() -> None:
    assert CronSlots.parse("*/5 * * * *").period(utc(2026, 1, 1)) == timedelta(minutes=5)
    assert EverySlots(timedelta(seconds=7)).period(utc(2026, 1, 1)) == timedelta(seconds=7)


# -- misfire policies across a simulated downtime ----------------------------------------

EVERY_MINUTE = CronSlots.parse("* * * * *")
LAST = utc(2026, 1, 1, 10, 0)  # the newest slot dealt with before the downtime
BACK = utc(2026, 1, 1, 10, 30, 4)  # 30 minutes down; 10:30 is 4 s late, still on time


def test_no_downtime_fires_the_due_slot_only() -> None:
    plan = plan_due(EVERY_MINUTE, LAST, utc(2026, 1, 1, 10, 1, 0, 200_000), Misfire("skip"))
    assert plan.fire == (utc(2026, 1, 1, 10, 1),)
    assert plan.skipped == 0 and plan.late == 0
    assert plan_due(EVERY_MINUTE, LAST, utc(2026, 1, 1, 10, 0, 59), Misfire("skip")).idle


def test_skip_fires_only_what_is_on_time() -> None:
    plan = plan_due(EVERY_MINUTE, LAST, BACK, Misfire("skip"))
    assert plan.fire == (utc(2026, 1, 1, 10, 30),)
    assert plan.skipped == 29  # 10:01 .. 10:29
    assert plan.skip_through == utc(2026, 1, 1, 10, 29)


def test_once_fires_the_newest_missed_slot_then_the_on_time_one() -> None:
    plan = plan_due(EVERY_MINUTE, LAST, BACK, Misfire("once"))
    assert plan.fire == (utc(2026, 1, 1, 10, 29), utc(2026, 1, 1, 10, 30))
    assert plan.late == 1
    assert plan.skipped == 28 and plan.skip_through == utc(2026, 1, 1, 10, 28)


def test_catch_up_fires_the_newest_missed_slots_up_to_its_limit_oldest_first() -> None:
    plan = plan_due(EVERY_MINUTE, LAST, BACK, Misfire("catch_up", 5))
    assert plan.fire == tuple(utc(2026, 1, 1, 10, m) for m in (25, 26, 27, 28, 29, 30))
    assert plan.skipped == 24 and plan.skip_through == utc(2026, 1, 1, 10, 24)
    everything = plan_due(EVERY_MINUTE, LAST, BACK, Misfire("catch_up", 100))
    assert len(everything.fire) == 30 and everything.skipped == 0
    assert everything.skip_through is None


def test_a_slot_later_than_the_grace_is_missed() -> None:
    late = utc(2026, 1, 1, 10, 1, 11)  # 11 s after 10:01, beyond the 10 s grace
    assert plan_due(EVERY_MINUTE, LAST, late, Misfire("skip")).skipped == 1
    assert plan_due(EVERY_MINUTE, LAST, late, Misfire("once")).fire == (utc(2026, 1, 1, 10, 1),)


def test_long_downtime_of_a_fast_rule_is_counted_not_enumerated() -> None:
    fast = EverySlots(timedelta(seconds=1))
    week_later = LAST + timedelta(days=7, milliseconds=300)
    plan = plan_due(fast, LAST, week_later, Misfire("catch_up", 3))
    assert plan.fire[-1] == LAST + timedelta(days=7)
    assert len(plan.fire) == 4  # three missed and the on-time one
    assert plan.skipped == 7 * 86_400 - 4


def test_misfire_policy_is_checked() -> None:
    with pytest.raises(ValueError, match="must be one of"):
        Misfire("sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 1"):
        Misfire("catch_up", 0)
    assert Misfire("catch_up", 3).describe() == "catch_up 3"


# -- forward and backward agree, in any zone, across any DST change ------------------------

_EXPRS = [
    "30 2 * * *",
    "*/20 1,2,3 * * *",
    "0 * * * *",
    "*/15 * * * *",
    "45 0 * * MON-FRI",
    "0 0 L * *",
    "@daily",
]
_ZONES = ["UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata"]


@settings(max_examples=300)
@given(
    expr=st.sampled_from(_EXPRS),
    zone=st.sampled_from(_ZONES),
    t=st.datetimes(
        min_value=datetime(2025, 1, 1), max_value=datetime(2028, 12, 31), timezones=st.just(UTC)
    ),
)
def test_next_and_previous_slots_agree(expr: str, zone: str, t: datetime) -> None:
    slots = CronSlots.parse(expr, zone)
    following = slots.next_n(t, 3)
    assert t < following[0] < following[1] < following[2]
    first = following[0]
    # The slot is its own latest-at-or-before, and nothing lies between t and it.
    assert next(slots.at_or_before(first)) == first
    before = next(slots.at_or_before(first - timedelta(microseconds=1)))
    assert before <= t
    assert slots.next_after(before) == first


def test_a_half_hour_fold_keeps_every_real_occurrence() -> None:
    # Lord Howe sets its clocks back 30 minutes (02:00 -> 01:30) on 2026-04-05: 02:05
    # happens once, after the change, and an elapsed-time rule must not lose it.
    zone = ZoneInfo("Australia/Lord_Howe")
    slots = CronSlots.parse("5 */2 * * *", "Australia/Lord_Howe")
    found = slots.next_n(utc(2026, 4, 4, 13, 34), 2)
    assert local(found, zone) == ["04-05 02:05+1030", "04-05 04:05+1030"]
    assert next(slots.at_or_before(found[1] - timedelta(seconds=1))) == found[0]
    quarter = CronSlots.parse("*/15 * * * *", "Australia/Lord_Howe")
    # 01:30-01:59 happens twice: both passes fire, in real-time order.
    assert local(quarter.next_n(utc(2026, 4, 4, 14, 20), 6), zone) == [
        "04-05 01:30+1100",
        "04-05 01:45+1100",
        "04-05 01:30+1030",
        "04-05 01:45+1030",
        "04-05 02:00+1030",
        "04-05 02:15+1030",
    ]
