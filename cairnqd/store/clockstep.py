"""Wall-clock steps, ridden out, where the database's clock is the host's wall clock
(SQLite): `WallClockWatch` compares it with `CLOCK_BOOTTIME` and, for a grace after a
forward step, has statements read the old clock's continuation (docs/architecture.md,
"Wall-clock steps on SQLite").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("cairnqd.store")

#: A change of the wall clock against the monotonic one this large is a step.
STEP_S = 1.0
#: How long after a forward step to read the old clock: the default lease (30 s),
#: renewed on the new clock by then. A store that sees longer leases raises it.
DEFAULT_GRACE_S = 30.0


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class WallClockWatch:
    """The wall clock in epoch milliseconds, with its forward steps ridden out."""

    def __init__(
        self,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = _boottime,
        grace_s: float = DEFAULT_GRACE_S,
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self.grace_s = grace_s
        self._offset = wall() - monotonic()
        #: Monotonic time the current grace ends; the lag applies until then.
        self._grace_until = 0.0
        #: Seconds the statements' clock runs behind the wall clock in the grace.
        self._lag_s = 0.0
        #: The last step's size in seconds (positive: forward), for logs and tests.
        self.last_step_s = 0.0

    def at_least(self, grace_s: float) -> None:
        """Ride out a forward step for at least `grace_s` (a longer lease was seen)."""
        if grace_s > self.grace_s:
            self.grace_s = grace_s

    def __call__(self) -> int:
        """Now for statements, in epoch milliseconds."""
        mono = self._monotonic()
        wall = self._wall()
        offset = wall - mono
        step = offset - self._offset
        self._offset = offset
        if abs(step) >= STEP_S:
            self._stepped(step, mono)
        if self._lag_s and mono >= self._grace_until:
            self._lag_s = 0.0
            log.info("the wall clock's step is ridden out: statements read it again")
        return int((wall - self._lag_s) * 1000)

    def lease_lead_ms(self) -> int:
        """What a lease written now adds to `now + lease`, so it ends by the new clock."""
        return int(self._lag_s * 1000)

    def _stepped(self, step: float, mono: float) -> None:
        self.last_step_s = step
        if step > 0:
            self._lag_s += step
            self._grace_until = mono + self.grace_s
            log.warning(
                "the wall clock stepped forward by %.1fs: for the next %.0fs statements "
                "read the clock as it ran before, so live leases are renewed rather than "
                "taken for expired (keep NTP slewing, not stepping)",
                step, self.grace_s,
            )  # fmt: skip
            return
        # Back: a lag left from a forward step shrinks by it; what is due waits longer.
        self._lag_s = max(0.0, self._lag_s + step)
        log.warning(
            "the wall clock stepped back by %.1fs: tasks due at a wall-clock moment (retry "
            "backoffs, delays) and schedule slots wait that much longer (keep NTP "
            "slewing, not stepping)",
            -step,
        )
