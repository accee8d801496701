"""How long a child's event loop has gone without running: its lag, readable from
another thread.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import asyncio
import time

#: How often the loop stamps; the lag it reports is accurate to about this much.
TICK_S = 0.05


class LoopWatch:
    def __init__(self) -> None:
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
        self._handle = self._loop.call_later(TICK_S, self._tick)

    def lag(self) -> float:
        """Seconds since the loop last ran its stamp beyond the expected tick; 0 while
        it keeps up. Safe to call from any thread (one float read)."""
        return max(0.0, time.monotonic() - self._stamp - TICK_S)
