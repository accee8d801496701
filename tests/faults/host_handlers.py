"""Handlers for the multi-host tests (`tests.faults.host_handlers:registry`).

Each daemon runs with `CAIRNQD_TEST_HOST` naming its host. An execution is recorded in
the log named in the payload plus `.<host>` (the `fault_handlers.record` format), and
the result says which attempt on which host produced it, so a test can tell whose
write a task kept.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from cairnqd.registry import TaskRegistry
from tests.daemon.fault_handlers import record

registry = TaskRegistry()
HOST = os.environ.get("CAIRNQD_TEST_HOST", "unknown")


@registry.task("h.work")
async def work(ctx: Any, payload: Any) -> dict[str, Any]:
    where = {**payload, "log": f"{payload['log']}.{HOST}"} if payload.get("log") else payload
    record(where, "start", ctx)
    await asyncio.sleep(float(payload.get("seconds", 0.0)))
    record(where, "end", ctx)
    return {"attempt": ctx.attempt, "host": HOST}
