"""Handlers the dashboard tests run in real daemon children."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from cairnqd.registry import TaskRegistry

registry = TaskRegistry()


@registry.task("d.echo")
async def echo(ctx: Any, payload: Any) -> Any:
    return payload


@registry.task("d.fail")
async def fail(ctx: Any, payload: Any) -> Any:
    if payload.get("kind") == "lookup":
        raise LookupError(payload.get("message", "missing"))
    raise ValueError(payload.get("message", "boom"))


@registry.task("d.block")
async def block(ctx: Any, payload: Any) -> dict[str, Any]:
    """Reports progress, then runs until the file named in the payload exists."""
    await ctx.progress(0.5, payload.get("message", "halfway"))
    # Another process creates the file: there is no in-process event to await.
    while not os.path.exists(payload["until"]):  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    return {"released": True}
