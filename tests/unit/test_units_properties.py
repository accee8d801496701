"""cairnqd.config.units, property-based: every value survives format -> parse, and bad text
is a ValueError, never a crash.

`cairnqd check` and the example file write durations and sizes back with the format
functions, so a value that does not survive its own spelling would change a config on
the round trip. The example tests in test_config.py pin the spellings; these pin the
laws over the whole range.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cairnqd.config.units import (
    elapsed_text,
    format_duration,
    format_size,
    parse_duration,
    parse_size,
    to_ms,
)

MAX_MS = to_ms(timedelta.max)
# The config's units, largest first, as the parser requires them.
DURATION_UNITS_MS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}
UNIT_ORDER = list(DURATION_UNITS_MS)
SIZE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}

# Whole milliseconds: the resolution every duration in a config has.
durations = st.integers(min_value=0, max_value=MAX_MS).map(lambda ms: timedelta(milliseconds=ms))

# Sizes built from powers of two and five, so many are exact in several units at once
# (the interesting case for choosing a spelling); plain integers cover the rest.
sizes = st.one_of(
    st.integers(min_value=0, max_value=2**60),
    st.builds(
        lambda k, twos, fives: k * 2**twos * 5**fives,
        st.integers(min_value=0, max_value=5000),
        st.integers(min_value=0, max_value=45),
        st.integers(min_value=0, max_value=15),
    ),
)


@st.composite
def duration_texts(draw: st.DrawFn) -> tuple[str, int]:
    """A valid, not necessarily canonical, spelling (`90m`, `1h1500ms`) and its value."""
    chosen = draw(st.lists(st.sampled_from(list(DURATION_UNITS_MS)), min_size=1, unique=True))
    text, total = "", 0
    for unit in sorted(chosen, key=lambda u: -DURATION_UNITS_MS[u]):
        count = draw(st.integers(min_value=0, max_value=10_000))
        text += f"{count}{unit}"
        total += count * DURATION_UNITS_MS[unit]
    return text, total


@given(durations)
@example(timedelta(0))
@example(timedelta(milliseconds=MAX_MS))
def test_every_duration_survives_its_own_spelling(duration: timedelta) -> None:
    text = format_duration(duration)
    assert parse_duration(text) == duration, text


@given(duration_texts())
def test_any_valid_spelling_parses_to_its_value_and_formats_canonically(
    spelled: tuple[str, int],
) -> None:
    text, total_ms = spelled
    parsed = parse_duration(text)
    assert to_ms(parsed) == total_ms
    canonical = format_duration(parsed)
    assert parse_duration(canonical) == parsed
    assert format_duration(parse_duration(canonical)) == canonical
    # Canonical: no zero parts, and no part overflows into the next unit (no `90m`).
    if canonical != "0s":
        for count, unit in re.findall(r"(\d+)(ms|d|h|m|s)", canonical):
            assert int(count) > 0, canonical
            if unit != "d":
                larger = UNIT_ORDER[UNIT_ORDER.index(unit) - 1]
                assert int(count) * DURATION_UNITS_MS[unit] < DURATION_UNITS_MS[larger], canonical


@given(st.integers(min_value=0))
def test_a_bare_number_is_never_a_duration(count: int) -> None:
    # `lease: 30` could mean seconds or milliseconds; the unit is required.
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(str(count))


@given(st.one_of(st.text(alphabet="0123456789dhms .-", max_size=16), st.text(max_size=16)))
def test_bad_duration_text_is_a_value_error_never_a_crash(text: str) -> None:
    try:
        parsed = parse_duration(text)
    except ValueError as exc:
        assert repr(text) in str(exc)
    else:
        assert parsed >= timedelta(0)


@given(sizes)
@example(0)
@example(16_384_000_000)  # exact in both MB and MiB
def test_every_size_survives_its_own_spelling(size: int) -> None:
    text = format_size(size)
    assert parse_size(text) == size, text


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(list(SIZE_UNITS)))
def test_every_unit_spelling_parses_to_count_times_unit(count: int, unit: str) -> None:
    assert parse_size(f"{count}{unit}") == count * SIZE_UNITS[unit]


@given(st.one_of(st.text(alphabet="0123456789KMGTiB .", max_size=12), st.text(max_size=12)))
def test_bad_size_text_is_a_value_error_never_a_crash(text: str) -> None:
    try:
        parsed = parse_size(text)
    except ValueError as exc:
        assert repr(text) in str(exc)
    else:
        assert parsed >= 0


@given(st.integers(min_value=0, max_value=2**50) | st.sampled_from([16_384_000_000, 2**30]))
def test_format_size_is_the_shortest_exact_spelling(size: int) -> None:
    # 16_384_000_000 once came out as 15625MiB (8 characters) instead of 16384MB (7).
    exact = [f"{size // unit}{name}" for name, unit in SIZE_UNITS.items() if size % unit == 0]
    assert len(format_size(size)) == min(len(spelling) for spelling in exact)


@pytest.mark.parametrize(
    ("seconds", "sep", "text"),
    [
        (-3.0, "", "0.0s"),
        (4.25, "", "4.2s"),
        (42.9, "", "42s"),
        (303, "", "5m03s"),
        (303, " ", "5m 03s"),
        (7500, "", "2h05m"),
        (273_600, " ", "3d 04h"),
    ],
)
def test_elapsed_text_reads_as_the_cli_and_dashboard_show_it(
    seconds: float, sep: str, text: str
) -> None:
    assert elapsed_text(seconds, sep) == text
