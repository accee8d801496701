"""Durations and sizes as the config spells them, parsed and written back exactly.

A duration needs a unit (`250ms`, `30s`, `5m`, `1h`, `7d`, `1h30m`): a bare number
is refused, because `lease: 30` could mean seconds or milliseconds."""

from __future__ import annotations

import re
from datetime import timedelta

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?")
_DURATION_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1))
_SIZE = re.compile(r"(\d+)([KMGT]i?B|B)")
_SIZE_UNITS = {
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


def parse_duration_ms(text: str) -> int:
    """`"1h30m"` -> 5400000, however large (a timedelta ends at 999999999 days, so a
    bound is checked here before one is built). ValueError if not a duration."""
    match = _DURATION.fullmatch(text)
    if match is None or not any(match.groups()):
        raise ValueError(f"not a duration: {text!r}")
    counts = (int(n or 0) for n in match.groups())
    return sum(n * unit for n, (_, unit) in zip(counts, _DURATION_UNITS, strict=True))


def parse_duration(text: str) -> timedelta:
    """`"1h30m"` -> 90 minutes. Units descend, each at most once. ValueError if bad."""
    ms = parse_duration_ms(text)
    try:
        return timedelta(milliseconds=ms)
    except OverflowError:
        raise ValueError(f"duration too large: {text!r}") from None


def to_ms(duration: timedelta) -> int:
    """Exact integer milliseconds, as the protocol and SDK count time."""
    return duration // timedelta(milliseconds=1)


def format_duration(duration: timedelta) -> str:
    """The canonical spelling `parse_duration` reads back: 90 minutes -> `1h30m`."""
    rest = to_ms(duration)
    parts = []
    for suffix, unit in _DURATION_UNITS:
        count, rest = divmod(rest, unit)
        if count:
            parts.append(f"{count}{suffix}")
    return "".join(parts) or "0s"


def elapsed_text(seconds: float, sep: str = "") -> str:
    """A short human reading of an elapsed time, as `cairnqd status`, `top` and the
    dashboard show ages: 4.2s, 42s, 5m03s, 2h05m, 3d04h (`sep` goes between the two
    parts: "5m 03s"). A negative time (clocks of two hosts) reads as 0.0s."""
    seconds = max(0.0, seconds)
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m{sep}{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{sep}{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{sep}{s % 86400 // 3600:02d}h"


def parse_size(text: str) -> int:
    """`"512MiB"` -> bytes. ValueError if bad."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a size: {text!r}")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def format_size(size: int) -> str:
    """The shortest exact spelling: 2**30 -> `1GiB`, 500_000_000 -> `500MB`."""
    exact = [f"{size // unit}{name}" for name, unit in _SIZE_UNITS.items() if size % unit == 0]
    return min(exact, key=lambda text: (len(text), text))
