"""Demo handlers, so the example config runs as shipped.

`config/cairnq.example.yaml` points at `cairnqd.demo:registry`. Try:

    cairnqd -c config/cairnq.example.yaml
    cairnqd -c config/cairnq.example.yaml submit demo.sleep --queue slow --payload '{"seconds": 5}'
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Protocol

from cairnqd.errors import TaskError
from cairnqd.registry import TaskRegistry

__all__ = ["registry"]

registry = TaskRegistry()


class _Context(Protocol):
    """The part of the task context these handlers use."""

    async def progress(self, value: float | None, message: str | None = None) -> Any: ...


@registry.task("demo.echo")
async def echo(ctx: _Context, payload: Any) -> Any:
    """Return the payload unchanged."""
    return payload


@registry.task("demo.sleep")
async def sleep(ctx: _Context, payload: Any) -> dict[str, float]:
    """Sleep `payload["seconds"]` (default 1), reporting progress about once a second."""
    options = payload if isinstance(payload, dict) else {}
    seconds = options.get("seconds", 1)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise TaskError("payload.seconds must be a number >= 0", code="bad_payload")
    steps = max(1, math.ceil(seconds))
    for step in range(1, steps + 1):
        await asyncio.sleep(seconds / steps)
        await ctx.progress(step / steps, f"slept {seconds * step / steps:.1f}s of {seconds}s")
    return {"slept": float(seconds)}


@registry.task("demo.fail")
async def fail(ctx: _Context, payload: Any) -> None:
    """Fail on purpose; `{"retryable": true}` lets the task use its other attempts."""
    options = payload if isinstance(payload, dict) else {}
    raise TaskError(
        str(options.get("message", "demo.fail failed on purpose")),
        code="demo_failure",
        retryable=bool(options.get("retryable", False)),
    )
