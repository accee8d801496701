"""How long a child's event loop has gone without running: its lag, readable from
another thread.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import asyncio
import time

#: The tick's bounds. A tick wakes an idle loop: at the least tick, 100 times a
#: second, which is what a stall bound of 0.2 s asks; at the most, once a second.
MIN_TICK_S = 0.01
MAX_TICK_S = 1.0


def tick_for(stall_timeout_s: float) -> float:
    """The tick for a stall bound: a twentieth of it, so a stall is seen within 5% of
    the bound; 0.5 s for the default bound of a 30 s lease (10 s)."""
    return min(MAX_TICK_S, max(MIN_TICK_S, stall_timeout_s / 20))


class LoopWatch:
    def __init__(self, tick_s: float = MAX_TICK_S) -> None:
        #: How often the loop stamps; the lag it reports is accurate to about this much.
        self.tick_s = tick_s
        self._stamp = time.monotonic()
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin stamping on `loop` (call from the loop's thread)."""
        self._loop = loop
        self._tick()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        self._stamp = time.monotonic()
        assert self._loop is not None
        self._handle = self._loop.call_later(self.tick_s, self._tick)

    def lag(self) -> float:
        """Seconds since the loop last ran its stamp beyond the expected tick; 0 while
        it keeps up. Safe to call from any thread (one float read)."""
        return max(0.0, time.monotonic() - self._stamp - self.tick_s)
