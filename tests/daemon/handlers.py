"""Handlers the daemon tests load into real children (`tests.daemon.handlers:registry`)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from cairnqd.registry import TaskRegistry

registry = TaskRegistry()


@registry.task("t.echo")
async def echo(ctx: Any, payload: Any) -> Any:
    return payload


@registry.task("t.sleep")
async def sleep(ctx: Any, payload: Any) -> dict[str, Any]:
    await asyncio.sleep(float(payload.get("seconds", 0.1)))
    return {"pid": os.getpid()}


@registry.task("t.block")
async def block(ctx: Any, payload: Any) -> dict[str, Any]:
    """Runs until the file named in the payload exists (the test's release)."""
    # Another process creates the file, so there is no in-process event to await.
    while not os.path.exists(payload["until"]):  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    return {"pid": os.getpid()}


@registry.task("t.scribble")
async def scribble(ctx: Any, payload: Any) -> dict[str, Any]:
    """Writes the payload's lines on this child's events pipe, as a buggy handler (or
    a library that found the descriptor) might: the parent must survive any of them."""
    fd = int(sys.argv[sys.argv.index("--events") + 1])
    for line in payload["lines"]:
        os.write(fd, line.encode() + b"\n")
    return {"pid": os.getpid()}
