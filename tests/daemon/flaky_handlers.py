"""Handlers that refuse to load while `handlers-broken` exists in the daemon's working
directory: a test breaks and mends a group's code without a reload."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from cairnqd.registry import TaskRegistry

if os.path.exists("handlers-broken"):
    raise ImportError("handlers-broken exists: this module refuses to load")

registry = TaskRegistry()


@registry.task("f.echo")
async def echo(ctx: Any, payload: Any) -> Any:
    return payload


@registry.task("f.block")
async def block(ctx: Any, payload: Any) -> dict[str, Any]:
    """Runs until the file named in the payload exists (the test's release)."""
    while not os.path.exists(payload["until"]):  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    return {"pid": os.getpid()}
