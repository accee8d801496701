"""How many tasks a worker claims beyond its free call slots ("prefetch").

`auto` claims ahead what the worker's plain handlers are expected to start within
`HORIZON_S` at the pace they have shown, and nothing while a call runs longer than that
pace suggests (docs/architecture.md, "Claiming ahead").
"""

from __future__ import annotations

from typing import Literal

PrefetchSetting = int | Literal["auto"]


def check_prefetch(value: object) -> PrefetchSetting:
    """Validate a `prefetch` argument: "auto" or an integer >= 0."""
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f'prefetch must be "auto" or an integer >= 0, got {value!r}')
    return value


class PrefetchSizer:
    """Tracks the pace of plain handler calls and sizes the claim-ahead backlog."""

    #: A prefetched task should start within about this long of being claimed.
    HORIZON_S = 0.05
    #: Upper bound for `auto`: past this, bigger claims gain little on either dialect.
    AUTO_MAX = 512
    #: Weight of the newest call in the moving average of call durations.
    _ALPHA = 0.2

    def __init__(self, setting: PrefetchSetting) -> None:
        self.setting = check_prefetch(setting)
        self._mean_call_s: float | None = None

    @property
    def adaptive(self) -> bool:
        return self.setting == "auto"

    def observe(self, duration_s: float) -> None:
        """Record how long one plain handler call took."""
        if not self.adaptive:
            return
        mean = self._mean_call_s
        self._mean_call_s = duration_s if mean is None else mean + self._ALPHA * (duration_s - mean)

    def target(self, slots: int, longest_running_s: float = 0.0) -> int:
        """Tasks to hold beyond the free slots, for a worker with `slots` call slots
        whose longest plain call in flight has run `longest_running_s`."""
        if isinstance(self.setting, int):
            return self.setting
        mean = self._mean_call_s
        if mean is None:
            return 0  # no pace seen yet: claim only free slots, as the SDK does
        pace = max(mean, longest_running_s, 1e-6)
        return min(self.AUTO_MAX, int(slots * self.HORIZON_S / pace))
