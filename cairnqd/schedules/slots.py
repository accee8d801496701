"""Slots: the instants a schedule is due at, computed without a clock of their own.

Design note. Every function here takes the time it reasons about as an argument, so
tests (and `cairnqd schedules`) ask about any moment without waiting for it. A slot is
an aware UTC `datetime`; the same rule and the same `after` give the same slots on
every host, which is what lets a slot's time name its task (the submit key).

`every: <duration>` slots are the multiples of the interval since the Unix epoch (UTC):
`every: 1h` fires on the hour, on every host, whenever each one started.

A cron rule is read in its `timezone`, and daylight-saving changes follow one rule,
chosen by whether the expression names its hours:

- **It names them** (`30 2 * * *`, `*/10 1 * * *`, `@daily`): it is about wall-clock
  times. A time that does not exist (spring forward: 02:30 when clocks jump from 02:00
  to 03:00) is moved to the end of the gap, 03:00, and several such times collapse into
  that one firing. A time that happens twice (fall back: 01:30) fires once, at its first
  occurrence.
- **Its hour is a wildcard** (`*/15 * * * *`, `0 * * * *`, `@hourly`): it is about a
  rhythm, and follows elapsed time: it fires in each real hour, both passes of a
  repeated hour included, and has nothing due in a gap that never happened.

This is Debian cron's rule, extended to expressions that fix the hour but not the
minute, which cronsim by itself would fire twice in a repeated hour.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from cronsim import CronSim

from cairnqd.schedules.cron import CronExpression, parse_cron

__all__ = ["CronSlots", "EverySlots", "Slots", "from_ms", "to_ms"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_SECOND = timedelta(seconds=1)
_ONE_MINUTE = timedelta(minutes=1)
# The longest gap any zone has had is a day (Samoa, 2011): a bound on the walk out of one.
_MAX_GAP = timedelta(days=2)
#: A slot this late is still on time; later, it was missed (see `misfire`).
MAX_GRACE = timedelta(seconds=10)


def to_ms(instant: datetime) -> int:
    """Epoch milliseconds of an aware datetime, as the database stores slots."""
    return (instant - _EPOCH) // timedelta(milliseconds=1)


def from_ms(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


class Slots:
    """The slots of one rule. `after(t)` ascends from the first slot > t;
    `at_or_before(t)` descends from the last slot <= t."""

    #: How late a slot may be reached and still count as on time.
    grace: timedelta = MAX_GRACE

    def after(self, t: datetime) -> Iterator[datetime]:
        raise NotImplementedError

    def at_or_before(self, t: datetime) -> Iterator[datetime]:
        raise NotImplementedError

    def next_after(self, t: datetime) -> datetime:
        return next(self.after(t))

    def next_n(self, t: datetime, n: int) -> list[datetime]:
        found: list[datetime] = []
        for slot in self.after(t):
            if len(found) == n:
                break
            found.append(slot)
        return found

    def count_between(self, start: datetime, end: datetime, cap: int) -> int:
        """Slots s with start < s <= end, counting no further than `cap`."""
        n = 0
        for slot in self.after(start):
            if slot > end or n >= cap:
                break
            n += 1
        return n

    def period(self, t: datetime) -> timedelta:
        """The gap between the next two slots after `t`: the rhythm an alert compares
        the time since the last firing with."""
        first, second = self.next_n(t, 2)
        return second - first


@dataclass(frozen=True)
class EverySlots(Slots):
    """Multiples of `interval` since the Unix epoch."""

    interval: timedelta

    def __post_init__(self) -> None:
        if self.interval < _ONE_SECOND:
            raise ValueError("an every: interval must be at least 1s")

    @property
    def grace(self) -> timedelta:  # type: ignore[override]
        return min(MAX_GRACE, self.interval)

    def _index(self, t: datetime) -> int:
        return (t - _EPOCH) // self.interval

    def after(self, t: datetime) -> Iterator[datetime]:
        k = self._index(t) + 1
        while True:
            yield _EPOCH + k * self.interval
            k += 1

    def at_or_before(self, t: datetime) -> Iterator[datetime]:
        k = self._index(t)
        while True:
            yield _EPOCH + k * self.interval
            k -= 1

    def count_between(self, start: datetime, end: datetime, cap: int) -> int:
        return max(0, self._index(end) - self._index(start))  # exact: no need for the cap

    def period(self, t: datetime) -> timedelta:
        return self.interval


@dataclass(frozen=True)
class CronSlots(Slots):
    """A cron rule read in an IANA time zone, with the DST rule of the module note."""

    expression: CronExpression
    timezone: str = "UTC"
    zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "zone", ZoneInfo(self.timezone))

    @classmethod
    def parse(cls, text: str, timezone: str = "UTC") -> CronSlots:
        return cls(parse_cron(text), timezone)

    def after(self, t: datetime) -> Iterator[datetime]:
        if self.expression.names_its_hours:
            return self._wall_after(t)
        return self._elapsed(t, reverse=False)

    def at_or_before(self, t: datetime) -> Iterator[datetime]:
        if self.expression.names_its_hours:
            return self._wall_at_or_before(t)
        return self._elapsed(t, reverse=True)

    # -- wall-clock rules: iterate local times, then place each on the timeline --------

    def _local(self, t: datetime) -> datetime:
        return t.astimezone(self.zone).replace(tzinfo=None)

    def _wall_after(self, t: datetime) -> Iterator[datetime]:
        last = t
        for wall in CronSim(self.expression.five_fields, self._local(t)):
            instant = self._place(wall)
            # Strictly later than the last one given: a gap's collapsed times and the
            # second pass of a repeated hour (placed at its first pass) drop out here.
            if instant > last:
                last = instant
                yield instant

    def _wall_at_or_before(self, t: datetime) -> Iterator[datetime]:
        start = self._local(_floor_second(t)) + _MAX_GAP + _ONE_SECOND
        previous: datetime | None = None
        for wall in CronSim(self.expression.five_fields, start, reverse=True):
            instant = self._place(wall)
            if instant > t or instant == previous:
                continue
            if previous is not None and instant > previous:
                continue  # a repeated hour's time, already given at its first pass
            previous = instant
            yield instant

    def _place(self, wall: datetime) -> datetime:
        """The instant a local wall time means: its first occurrence, or the end of
        the gap it falls in."""
        moved = wall
        while not self._exists(moved):
            moved += _ONE_MINUTE
            if moved - wall > _MAX_GAP:  # pragma: no cover - no zone has such a gap
                raise ValueError(f"{wall} is inside a gap longer than {_MAX_GAP}")
        return moved.replace(tzinfo=self.zone, fold=0).astimezone(UTC)

    def _exists(self, wall: datetime) -> bool:
        aware = wall.replace(tzinfo=self.zone)
        return aware.astimezone(UTC).astimezone(self.zone).replace(tzinfo=None) == wall

    # -- elapsed-time rules: iterate the real timeline in the zone ---------------------

    def _elapsed(self, t: datetime, *, reverse: bool) -> Iterator[datetime]:
        local = _floor_second(t).astimezone(self.zone)
        if reverse:
            local += _ONE_SECOND  # the iteration starts one second before its start
        for slot in CronSim(self.expression.five_fields, local, reverse=reverse):
            if _imaginary(slot):
                continue  # a local time inside a gap: it never happened
            yield slot.astimezone(UTC)


def _floor_second(t: datetime) -> datetime:
    return t.replace(microsecond=0)


def _imaginary(aware: datetime) -> bool:
    return aware != aware.astimezone(UTC).astimezone(aware.tzinfo)
