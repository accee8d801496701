"""Keeping a flood of alike log records from drowning the log.

`Burst`: at most `burst` records per `window_s`, the next one saying how many were held
back. `Repeats`: the same kind of record at most once per `every_s`, the first at once
(docs/architecture.md, "Failures in the log").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable


class Burst:
    """At most `burst` admitted per `window_s`."""

    def __init__(
        self, burst: int = 10, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._burst = burst
        self._window_s = window_s
        self._clock = clock
        self._window_start = clock()
        self._admitted = 0
        self._held_back = 0

    def admit(self) -> int | None:
        """None to hold this one back; otherwise log it, and the count is how many were
        held back since the last one logged."""
        now = self._clock()
        if now - self._window_start >= self._window_s:
            self._window_start, self._admitted = now, 0
        if self._admitted >= self._burst:
            self._held_back += 1
            return None
        self._admitted += 1
        held_back, self._held_back = self._held_back, 0
        return held_back


class Repeats:
    """The first record of a kind at once, the same kind again at most once per
    `every_s`. Not thread-safe: one per event loop."""

    #: Kinds remembered at most; past it, the ones not seen for `every_s` are forgotten.
    MAX_KINDS = 256

    def __init__(self, every_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        # kind -> (when it was last logged, how many were held back since)
        self._seen: dict[Hashable, tuple[float, int]] = {}

    def admit(self, kind: Hashable) -> int | None:
        """None to hold this one back; otherwise log it, and the count is how many of
        the same kind were held back since the last one logged."""
        now = self._clock()
        seen = self._seen.get(kind)
        if seen is not None and now - seen[0] < self.every_s:
            self._seen[kind] = (seen[0], seen[1] + 1)
            return None
        if seen is None and len(self._seen) >= self.MAX_KINDS:
            self._forget(now)
        self._seen[kind] = (now, 0)
        return 0 if seen is None else seen[1]

    def _forget(self, now: float) -> None:
        stale = [kind for kind, (at, _) in self._seen.items() if now - at >= self.every_s]
        for kind in stale:
            del self._seen[kind]
        if len(self._seen) >= self.MAX_KINDS:
            self._seen.clear()


__all__ = ["Burst", "Repeats"]
