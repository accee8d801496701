"""LoopWatch reports a real event loop's stall to another thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from cairnqd.daemon.child.loopwatch import MAX_TICK_S, MIN_TICK_S, LoopWatch, tick_for
from tests.support.waiting import wait_for


@pytest.mark.timing
def test_a_blocked_loop_shows_its_lag_to_another_thread() -> None:
    watch = LoopWatch(tick_for(10.0))
    blocked = threading.Event()
    release = threading.Event()

    async def main() -> None:
        watch.start(asyncio.get_running_loop())
        await asyncio.sleep(0.2)
        blocked.set()
        release.wait(10)  # blocks the loop itself, as a sync call in a handler would
        await asyncio.sleep(0.2)
        watch.stop()

    runner = threading.Thread(target=asyncio.run, args=(main(),))
    runner.start()
    try:
        wait_for("the loop to start", blocked.is_set)
        assert watch.lag() < 0.5
        wait_for("the lag to pass 1s", lambda: watch.lag() > 1.0, timeout=10)
    finally:
        release.set()
        runner.join(10)
    # Once the loop runs again the lag drops back at its next tick.
    assert not runner.is_alive()


@pytest.mark.timing
def test_a_running_loop_has_no_lag() -> None:
    watch = LoopWatch(tick_for(10.0))
    lags: list[float] = []

    async def main() -> None:
        watch.start(asyncio.get_running_loop())
        for _ in range(10):
            await asyncio.sleep(0.03)
            lags.append(watch.lag())
        watch.stop()

    asyncio.run(main())
    assert max(lags) < 0.5, lags


def test_the_tick_follows_the_stall_bound_within_its_limits() -> None:
    # The default bound (lease 30 s / 3): two wake-ups a second, a stall seen within 5%.
    assert tick_for(10.0) == 0.5
    assert tick_for(0.1) == MIN_TICK_S  # a tight bound is honoured, at a cost
    assert tick_for(3600.0) == MAX_TICK_S  # never blind for long
