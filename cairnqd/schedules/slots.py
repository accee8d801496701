"""Slots: the instants a schedule is due at, computed without a clock of their own.

Every function takes its moment as an argument; a slot is an aware UTC `datetime`, the
same on every host for the same rule. `every:` slots are multiples of the interval since
the epoch; cron rules follow docs/schedules.md, "Daylight saving time". cronsim steps
naive wall times; `CronSlots._instants` places them on the timeline.
"""

from __future__ import annotations

import heapq
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
# The most a wall clock is set back at once (an hour nearly everywhere; two for the
# double summer times of the 1940s): how far elapsed-time iteration looks ahead.
_MAX_FOLD = timedelta(hours=2)
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
        heap: list[tuple[datetime, datetime]] = []
        last = t
        lookahead = self._lookahead()
        walls = CronSim(self.expression.five_fields, self._local(t) - lookahead)
        for wall in _until_exhausted(walls):
            if wall is not None:
                for instant in self._instants(wall):
                    if instant > t:
                        heapq.heappush(heap, (instant, wall))
            # Walls still to come lie later on the wall clock, and the wall clock never
            # goes back by more than `lookahead`: an instant whose wall is that far behind
            # comes before every instant still to come.
            while heap and (wall is None or heap[0][1] <= wall - lookahead):
                instant, _ = heapq.heappop(heap)
                if instant > last:  # a gap's collapsed times come out once
                    last = instant
                    yield instant
            if wall is None:
                return

    def at_or_before(self, t: datetime) -> Iterator[datetime]:
        heap: list[tuple[int, datetime, datetime]] = []
        last: datetime | None = None
        lookahead = self._lookahead()
        # The reverse iteration starts one second before its start; added in UTC, since
        # on the wall 01:59:59 + 1 s may be an hour later. It starts a fold ahead: from
        # the second pass of a repeated hour, later wall times have happened already.
        start = self._local(_floor_second(t) + _ONE_SECOND) + _MAX_FOLD
        walls = CronSim(self.expression.five_fields, start, reverse=True)
        for wall in _until_exhausted(walls):
            if wall is not None:
                for instant in self._instants(wall):
                    if instant <= t:
                        heapq.heappush(heap, (-to_ms(instant), instant, wall))
            while heap and (wall is None or heap[0][2] >= wall + lookahead):
                _, instant, _ = heapq.heappop(heap)
                if last is None or instant < last:
                    last = instant
                    yield instant
            if wall is None:
                return

    def _lookahead(self) -> timedelta:
        """How far behind the wall time being read an instant must be before it can be
        given out. Wall-clock rules place each time at its first occurrence (or a gap's
        end), which follows wall-time order: none. Elapsed-time rules give both passes of
        a repeated hour, so a later wall time can be an earlier instant."""
        return timedelta(0) if self.expression.names_its_hours else _MAX_FOLD

    def _local(self, t: datetime) -> datetime:
        return t.astimezone(self.zone).replace(tzinfo=None)

    def _instants(self, wall: datetime) -> list[datetime]:
        """The instants a local wall time stands for under this rule."""
        if self.expression.names_its_hours:
            return [self._place(wall)]
        # Elapsed time: every real occurrence (two in a repeated hour, none in a gap).
        found: list[datetime] = []
        for fold in (0, 1):
            aware = wall.replace(tzinfo=self.zone, fold=fold)
            instant = aware.astimezone(UTC)
            if instant.astimezone(self.zone).replace(tzinfo=None) == wall and instant not in found:
                found.append(instant)
        return sorted(found)

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


def _until_exhausted(walls: CronSim) -> Iterator[datetime | None]:
    """The wall times, then None once cronsim finds no more (it gives up after 50
    years), so the caller can flush what it holds."""
    while True:
        try:
            yield next(walls)
        except StopIteration:
            yield None
            return


def _floor_second(t: datetime) -> datetime:
    return t.replace(microsecond=0)
