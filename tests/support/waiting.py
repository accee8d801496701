"""Condition waits with deadlines: how every test waits for something to happen.

A wait polls an observation until `accept` holds for it, and returns the accepted value.
When the deadline passes it fails with what was awaited, how long it waited, and the
last value it saw, so a red test says where it got stuck instead of just "timed out".
An observation that raises ends the wait at once: a daemon that exited is a failure,
not a reason to keep polling.

`wait_for` (sync) and `wait_for_async` share one poll schedule and one failure message;
the async one also accepts an observation that returns an awaitable. The pause between
polls starts short, so a condition that is nearly true costs little, and grows to a cap,
so an expensive observation (a fresh database connection, a /metrics scrape) does not
load the two shared cores the tests run on. The pause only paces the polling: nothing
here sleeps to synchronize.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# Generous on purpose: a condition that holds returns at once, so only a failing test
# pays the deadline, and the test machine is shared with other suites.
DEFAULT_TIMEOUT_S = 30.0

_FIRST_PAUSE_S = 0.005
_MAX_PAUSE_S = 0.05
# Keeps the failure message readable when the last value is a big row or a log.
_MAX_SHOWN_CHARS = 600


class WaitTimeout(AssertionError):
    """A condition did not hold before its deadline (an assertion failure in pytest)."""


def _truthy(value: object) -> bool:
    return bool(value)


def _shown(value: object) -> str:
    text = repr(value)
    if len(text) <= _MAX_SHOWN_CHARS:
        return text
    return f"{text[:_MAX_SHOWN_CHARS]}... ({len(text)} chars)"


class _Schedule:
    """The deadline, the pauses between polls and the failure message, shared by both waits."""

    def __init__(self, what: str, timeout: float) -> None:
        self.what = what
        self.timeout = timeout
        self.started = time.monotonic()
        self.polls = 0
        self.pause = _FIRST_PAUSE_S

    def done(self, value: T, accept: Callable[[T], object]) -> bool:
        """True when `value` is accepted; raises once the deadline has passed without it."""
        self.polls += 1
        if accept(value):
            return True
        waited = time.monotonic() - self.started
        if waited > self.timeout:
            raise WaitTimeout(
                f"timed out after {waited:.1f}s (limit {self.timeout:g}s) waiting for "
                f"{self.what}; {self.polls} polls, last value seen: {_shown(value)}"
            )
        return False

    def next_pause(self) -> float:
        pause = self.pause
        self.pause = min(pause * 2, _MAX_PAUSE_S)
        return pause


def wait_for(
    what: str,
    observe: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT_S,
    *,
    accept: Callable[[T], object] = _truthy,
) -> T:
    """Poll `observe()` until `accept(value)` holds; return that value.

    `what` completes the sentence "waiting for ..." in the failure message.
    """
    schedule = _Schedule(what, timeout)
    while not schedule.done(value := observe(), accept):
        time.sleep(schedule.next_pause())
    return value


async def wait_for_async(
    what: str,
    observe: Callable[[], T | Awaitable[T]],
    # The poll loop owns the deadline so the failure can name the last value seen;
    # asyncio.timeout would cancel an observation halfway and lose it.
    timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109
    *,
    accept: Callable[[T], object] = _truthy,
) -> T:
    """`wait_for` for async tests: `observe` may return a value or an awaitable of one."""
    schedule = _Schedule(what, timeout)
    while True:
        observed = observe()
        value: T = await observed if inspect.isawaitable(observed) else observed
        if schedule.done(value, accept):
            return value
        await asyncio.sleep(schedule.next_pause())
