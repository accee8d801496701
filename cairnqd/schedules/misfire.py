"""What to enqueue when a schedule is looked at: the due slots, and the missed ones.

Every slot in (`last`, `now`] is due; one within the rule's grace is on time, older ones
are missed and the policy (`skip`, `once`, `catch_up` N) decides which fire; the rest are
counted as skipped. `plan_due` is pure (docs/schedules.md, "Misfires").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Literal

from cairnqd.schedules.slots import Slots

__all__ = ["POLICIES", "DuePlan", "Misfire", "plan_due"]

POLICIES = ("skip", "once", "catch_up")
#: Missed slots are counted up to this many per look (a year of a per-minute rule is
#: 525,600 iterations; the count only feeds a metric).
COUNT_CAP = 100_000


@dataclass(frozen=True)
class Misfire:
    policy: Literal["skip", "once", "catch_up"] = "once"
    #: For catch_up: how many missed slots at most fire, newest first.
    limit: int = 1

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"misfire policy must be one of {', '.join(POLICIES)}")
        if self.limit < 1:
            raise ValueError("a catch_up limit must be at least 1")

    @property
    def keeps(self) -> int:
        """How many missed slots fire."""
        return {"skip": 0, "once": 1, "catch_up": self.limit}[self.policy]

    def describe(self) -> str:
        return f"catch_up {self.limit}" if self.policy == "catch_up" else self.policy


@dataclass(frozen=True)
class DuePlan:
    """What to do now: fire `fire` in order; before that, give up the `skipped` missed
    slots up to `skip_through` (None when nothing is given up)."""

    fire: tuple[datetime, ...] = ()
    skipped: int = 0
    skip_through: datetime | None = None
    #: Missed slots among `fire` (the policy kept them).
    late: int = 0

    @property
    def idle(self) -> bool:
        return not self.fire and not self.skipped


def plan_due(slots: Slots, last: datetime, now: datetime, misfire: Misfire) -> DuePlan:
    """The plan for the slots in (`last`, `now`]."""
    cutoff = now - slots.grace
    on_time: list[datetime] = []
    for slot in slots.after(max(last, cutoff)):
        if slot > now:
            break
        on_time.append(slot)
    if cutoff <= last:
        return DuePlan(fire=tuple(on_time))
    # Missed: (last, cutoff]. Walk back from the newest, keeping what the policy keeps.
    newest_missed = list(islice(_between_desc(slots, last, cutoff), misfire.keeps + 1))
    kept = newest_missed[: misfire.keeps]
    given_up = newest_missed[misfire.keeps :]
    skipped, skip_through = 0, None
    if given_up:
        skip_through = given_up[0]
        skipped = slots.count_between(last, skip_through, COUNT_CAP)
    return DuePlan(
        fire=(*reversed(kept), *on_time),
        skipped=skipped,
        skip_through=skip_through,
        late=len(kept),
    )


def _between_desc(slots: Slots, after: datetime, through: datetime) -> Iterator[datetime]:
    for slot in slots.at_or_before(through):
        if slot <= after:
            return
        yield slot
