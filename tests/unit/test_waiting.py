"""tests.support.waiting: both condition waits return the accepted value and fail the same way."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.waiting import WaitTimeout, wait_for, wait_for_async


def counter() -> Callable[[], int]:
    """An observation that counts its own calls: 1, 2, 3, ..."""
    return itertools.count(1).__next__


async def run_async_wait(what: str, observe: Callable[[], Any], **kw: Any) -> Any:
    return await wait_for_async(what, observe, **kw)


def run_sync_wait(what: str, observe: Callable[[], Any], **kw: Any) -> Any:
    return wait_for(what, observe, **kw)


async def either_wait(sync: bool, what: str, observe: Callable[[], Any], **kw: Any) -> Any:
    if sync:
        return run_sync_wait(what, observe, **kw)
    return await run_async_wait(what, observe, **kw)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_returns_the_first_accepted_value(sync: bool) -> None:
    got = await either_wait(sync, "the count to reach 3", counter(), accept=lambda n: n >= 3)
    assert got == 3


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_default_acceptance_is_truthiness(sync: bool) -> None:
    values = iter([None, 0, "", [], {"ready": True}])
    assert await either_wait(sync, "a truthy value", lambda: next(values)) == {"ready": True}


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_timeout_names_what_how_long_and_the_last_value(sync: bool) -> None:
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as caught:
        await either_wait(
            sync,
            "the moon",
            lambda: {"phase": "new"},
            timeout=0.2,
            accept=lambda m: m["phase"] == "full",
        )
    assert time.monotonic() - started >= 0.2
    message = str(caught.value)
    assert re.match(
        r"timed out after \d+\.\ds \(limit 0\.2s\) waiting for the moon; \d+ polls, "
        r"last value seen: \{'phase': 'new'\}$",
        message,
    ), message
    # A timeout is an assertion failure, so pytest reports it as a failed check.
    assert isinstance(caught.value, AssertionError)


async def test_both_waits_fail_with_the_same_message() -> None:
    with pytest.raises(WaitTimeout) as sync_failure:
        wait_for("x", lambda: 0, timeout=0.05)
    with pytest.raises(WaitTimeout) as async_failure:
        await wait_for_async("x", lambda: 0, timeout=0.05)

    def shape(e: BaseException) -> str:
        return re.sub(r"\d+(\.\d+)?s \(|\d+ polls", "N", str(e))

    assert shape(sync_failure.value) == shape(async_failure.value)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_long_last_values_are_shortened(sync: bool) -> None:
    with pytest.raises(WaitTimeout) as caught:
        await either_wait(
            sync, "a short log", lambda: "x" * 5000, timeout=0.05, accept=lambda _: False
        )
    message = str(caught.value)
    assert len(message) < 1000
    assert message.endswith("... (5002 chars)")


@pytest.mark.timing
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_an_observation_that_raises_ends_the_wait_at_once(sync: bool) -> None:
    def observe() -> bool:
        raise RuntimeError("the daemon exited")

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="the daemon exited"):
        await either_wait(sync, "never", observe, timeout=30)
    assert time.monotonic() - started < 5


async def test_async_wait_awaits_an_async_observation() -> None:
    calls = counter()

    async def observe() -> int:
        return calls()

    assert await wait_for_async("the third call", observe, accept=lambda n: n == 3) == 3
