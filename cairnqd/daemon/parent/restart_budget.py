"""Restart pacing: per-slot backoff and the per-group crash budget.

Backoff grows per consecutive crash of one slot (1 s doubling, capped, jittered to
0.5-1x so a database blip does not restart every slot in lockstep) and resets once a
child has stayed ready for a minute. The budget caps crash restarts per group in a
sliding window; a group that spends it is in `crashloop` (dead slots stay empty until
the window has room) but is not FATAL: a poison task burns at most max_attempts
crashes and then the group heals by itself.
"""

from __future__ import annotations

import random
from collections import deque

HEALTHY_AFTER_S = 60.0


def backoff_s(consecutive_crashes: int, cap_s: float, rand: float | None = None) -> float:
    if consecutive_crashes <= 0:
        return 0.0
    base = min(cap_s, 2.0 ** (consecutive_crashes - 1))
    r = random.uniform(0.5, 1.0) if rand is None else rand
    return base * r


class RestartBudget:
    def __init__(self, budget: int, window_s: float) -> None:
        self.budget = budget
        self.window_s = window_s
        self._spent: deque[float] = deque()

    def configure(self, budget: int, window_s: float) -> None:
        self.budget, self.window_s = budget, window_s

    def _forget_old(self, now: float) -> None:
        while self._spent and now - self._spent[0] > self.window_s:
            self._spent.popleft()

    def exhausted(self, now: float) -> bool:
        self._forget_old(now)
        return len(self._spent) >= self.budget

    def spend(self, now: float) -> None:
        self._forget_old(now)
        self._spent.append(now)

    def reset(self) -> None:
        self._spent.clear()
