"""Handlers the cancel tests load into real children (`tests.daemon.cancel_handlers:registry`).

Each records what happens to it in the file named by the payload's `log`, one line per
event (`fault_handlers.record`: start, end, cancelled, swallowed), so a test can see
whether a handler was interrupted and how many executions ended.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from cairnqd.registry import TaskRegistry
from tests.daemon.fault_handlers import record

registry = TaskRegistry()


@registry.task("c.ignore")
async def ignore(ctx: Any, payload: Any) -> str:
    """Never looks at ctx.canceled(): only the worker's cancellation stops it."""
    record(payload, "start", ctx)
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        record(payload, "cancelled", ctx)
        raise
    return "never"


@registry.task("c.polite")
async def polite(ctx: Any, payload: Any) -> str:
    """Checks ctx.canceled() between steps and returns once it says so."""
    record(payload, "start", ctx)
    while True:
        try:
            if await ctx.canceled():
                break
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            record(payload, "cancelled", ctx)
            raise
    record(payload, "end", ctx)
    return "stopped early"


@registry.task("c.sync_block")
def sync_block(ctx: Any, payload: Any) -> str:
    """A sync handler in its thread: nothing can interrupt it but the process's end."""
    record(payload, "start", ctx)
    time.sleep(3600)
    record(payload, "end", ctx)
    return "never"


@registry.task("c.swallow")
async def swallow(ctx: Any, payload: Any) -> str:
    """Catches every cancellation and carries on."""
    record(payload, "start", ctx)
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            record(payload, "swallowed", ctx)
    record(payload, "end", ctx)
    return "never"


@registry.task("c.gate")
async def gate(ctx: Any, payload: Any) -> str:
    """Returns once the file named in `release` exists (the test's go-ahead)."""
    record(payload, "start", ctx)
    while not os.path.exists(payload["release"]):  # noqa: ASYNC110 - another process decides
        await asyncio.sleep(0.01)
    record(payload, "end", ctx)
    return "released"
