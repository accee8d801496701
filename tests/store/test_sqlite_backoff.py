"""The SQLITE_BUSY backoff: quick retries while a rival's cycle holds the write lock,
fewer once the wait is longer than a cycle (store/sqlite/statements.py `Backoff`)."""

from __future__ import annotations

import asyncio
import time

import pytest

from cairnqd.store.sqlite.statements import Backoff


async def test_the_cap_is_short_for_a_short_wait_and_longer_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_sleep = asyncio.sleep
    asked: list[tuple[float, float]] = []  # (seconds waited so far, sleep asked for)
    started = time.monotonic()

    async def recording_sleep(delay: float) -> None:
        asked.append((time.monotonic() - started, delay))
        await real_sleep(delay)

    monkeypatch.setattr(asyncio, "sleep", recording_sleep)
    backoff = Backoff(10_000)
    while time.monotonic() - started < 0.1:
        await backoff.sleep()

    short = [delay for waited, delay in asked if waited <= Backoff._SHORT_S]
    assert short, asked
    assert max(short) <= Backoff._CAP_S
    # Past the first stretch (by the test's clock, which started earlier) the waits grow,
    # never beyond the long cap.
    assert max(delay for _, delay in asked) > Backoff._CAP_S * 1.5
    assert all(delay <= Backoff._LONG_CAP_S for _, delay in asked)


@pytest.mark.timing
async def test_the_budget_ends_the_wait() -> None:
    backoff = Backoff(30)
    started = time.monotonic()
    while not backoff.spent():
        await backoff.sleep()
        assert time.monotonic() - started < 5
    assert time.monotonic() - started >= 0.03
