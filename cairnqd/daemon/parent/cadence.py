"""When the supervisor's loop must next run its steps (`Supervisor._tick`), and how late
it ran them.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: The shortest pause between two scheduled ticks: while something moves step by step
#: (a child booting, a roll, a reload, a stop) or a deadline is already due.
BUSY_TICK_S = 0.1
#: The longest pause when all is steady: a bound on what no deadline foresees.
IDLE_TICK_S = 1.0


@dataclass(frozen=True)
class Due:
    """A reason for the loop to run its steps at `at` (monotonic seconds); `at` at or
    before the tick that asked means "as soon as the busy tick allows"."""

    at: float
    why: str


class Cadence:
    """The loop's schedule: `plan()` after each tick, from every reason to tick again;
    `wait_s()` is how long the loop may then sleep in its select, and `late_s()` how
    much later than planned a tick ran (the parent was stopped or starved). Signals,
    child messages that change the loop's work and the upgrade links cut the sleep
    short by themselves: they need no reason here."""

    def __init__(self, now: float) -> None:
        #: When the next tick is due, and why.
        self.next = Due(now, "start")
        #: Ticks run since the loop started (the status snapshot's `loop.ticks`).
        self.ticks = 0

    def plan(self, started: float, reasons: Iterable[Due]) -> Due:
        """Schedule the next tick after one that started at `started`: the earliest of
        `reasons`, no sooner than `BUSY_TICK_S` and no later than `IDLE_TICK_S` after it."""
        self.ticks += 1
        soonest = min(reasons, key=lambda due: due.at, default=None)
        if soonest is None or soonest.at >= started + IDLE_TICK_S:
            self.next = Due(started + IDLE_TICK_S, "idle")
        elif soonest.at <= started + BUSY_TICK_S:
            self.next = Due(started + BUSY_TICK_S, soonest.why)
        else:
            self.next = soonest
        return self.next

    def wait_s(self, now: float) -> float:
        return max(0.0, self.next.at - now)

    def due(self, now: float) -> bool:
        return now >= self.next.at

    def late_s(self, now: float) -> float:
        """How long after its planned time a tick running at `now` runs (0 if early:
        an event brought it forward)."""
        return max(0.0, now - self.next.at)
