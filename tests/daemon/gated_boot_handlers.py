"""Handlers whose import waits until the file named by CAIRNQD_TEST_BOOT_GATE exists:
the daemon's start-up (its handler import probe, then each child's boot) holds for as
long as the test wants, a window to signal the parent in."""

from __future__ import annotations

import os
import time
from typing import Any

from cairnqd.registry import TaskRegistry

_gate = os.environ.get("CAIRNQD_TEST_BOOT_GATE")
# Another process creates the file, so there is nothing in-process to wait on.
while _gate and not os.path.exists(_gate):
    time.sleep(0.02)

registry = TaskRegistry()


@registry.task("gated.echo")
async def echo(ctx: Any, payload: Any) -> Any:
    return payload
