"""How many examples the Hypothesis state-machine models run.

The suite runs the counts the models give, sized to keep a CI run short. Set
`CAIRNQD_MODEL_SCALE` to a positive number to run that many times as many (10 for a
deeper search after a change to leases, claims or limits)."""

from __future__ import annotations

import math
import os

SCALE_ENV = "CAIRNQD_MODEL_SCALE"


def examples(count: int) -> int:
    """`count`, scaled by CAIRNQD_MODEL_SCALE; at least 1."""
    raw = os.environ.get(SCALE_ENV, "").strip()
    if not raw:
        return count
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"{SCALE_ENV}={raw!r}: expected a positive number") from None
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"{SCALE_ENV}={raw!r}: expected a positive number")
    return max(1, round(count * scale))
