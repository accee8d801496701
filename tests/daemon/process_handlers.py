"""Handlers that start processes of their own (`tests.daemon.process_handlers:registry`).

Each writes the pids it started, one a line, to the file its payload names, so a test
can watch them from outside.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from typing import Any

from cairnqd.registry import TaskRegistry

registry = TaskRegistry()

#: A process that ignores SIGTERM: only SIGKILL ends it (exec keeps the ignore).
_STUBBORN = ["sh", "-c", "trap '' TERM; exec sleep 1000"]


def _start(payload: Any) -> None:
    started = [subprocess.Popen(["sleep", "1000"])]
    if payload.get("stubborn"):
        started.append(subprocess.Popen(_STUBBORN))
    with open(payload["pids"], "a") as f:
        f.write("".join(f"{p.pid}\n" for p in started))


@registry.task("p.start")
async def start(ctx: Any, payload: Any) -> dict[str, Any]:
    """Leaves its processes running and returns; with `until`, first waits for that
    file to exist (the test's release)."""
    _start(payload)
    until = payload.get("until")
    # Another process creates the file, so there is no in-process event to await.
    while until is not None and not os.path.exists(until):  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    return {"pid": os.getpid()}


@registry.task("p.crash")
async def crash(ctx: Any, payload: Any) -> None:
    """Starts its processes, then kills its child."""
    _start(payload)
    os._exit(3)
