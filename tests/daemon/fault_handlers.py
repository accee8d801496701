"""Handlers the fault tests load into real children (`tests.daemon.fault_handlers:registry`).

Each execution is recorded as one line appended to the file named in the payload's
`log` (O_APPEND writes of a short line are atomic), so a test can count executions
and see whether two ran at the same time: `start <id> <attempt> <pid> <t>` before the
work, `end ...` after it.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from cairnqd.registry import TaskRegistry

registry = TaskRegistry()


def record(payload: Any, what: str, ctx: Any) -> None:
    if not payload.get("log"):
        return
    line = f"{what} {ctx.task_id} {ctx.attempt} {os.getpid()} {time.monotonic():.6f}\n"
    fd = os.open(payload["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@registry.task("f.quick")
async def quick(ctx: Any, payload: Any) -> str:
    record(payload, "start", ctx)
    await asyncio.sleep(float(payload.get("seconds", 0.0)))
    record(payload, "end", ctx)
    return "ok"


def earlier_attempt_alive(payload: Any, ctx: Any) -> bool:
    """Whether a process that ran an earlier attempt of this task is still alive: two
    copies of one task running at once."""
    if not payload.get("log") or not os.path.exists(payload["log"]):
        return False
    with open(payload["log"]) as log:
        pids = {
            int(fields[3])
            for fields in (line.split() for line in log)
            if fields[0] == "start" and fields[1] == ctx.task_id and int(fields[2]) < ctx.attempt
        }
    for pid in pids - {os.getpid()}:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return True
    return False


@registry.task("f.block")
async def block(ctx: Any, payload: Any) -> str:
    """Blocks the event loop (a sync call in an async handler) on the attempts listed,
    and raises on those in `fail_on`. Notes `overlap` first if an earlier attempt's
    process still runs."""
    if earlier_attempt_alive(payload, ctx):
        record(payload, "overlap", ctx)
    record(payload, "start", ctx)
    if ctx.attempt in payload.get("fail_on", []):
        raise ValueError(f"planned failure of attempt {ctx.attempt}")
    if ctx.attempt in payload.get("block_on", [1]):
        time.sleep(float(payload["seconds"]))
    record(payload, "end", ctx)
    return f"attempt {ctx.attempt}"


@registry.task("f.gate")
async def gate(ctx: Any, payload: Any) -> str:
    """Returns once the file named in `release` exists (the test's go-ahead)."""
    record(payload, "start", ctx)
    while not os.path.exists(payload["release"]):  # noqa: ASYNC110 - another process decides
        await asyncio.sleep(0.01)
    record(payload, "end", ctx)
    return "released"


@registry.task("f.stubborn")
def stubborn(ctx: Any, payload: Any) -> str:
    """A sync handler, whose thread no cancel can stop, that runs `seconds` on the
    attempts listed in `long_on`. Notes `overlap` first if an earlier attempt's process
    still runs."""
    if earlier_attempt_alive(payload, ctx):
        record(payload, "overlap", ctx)
    record(payload, "start", ctx)
    if ctx.attempt in payload.get("long_on", [1]):
        time.sleep(float(payload["seconds"]))
    record(payload, "end", ctx)
    return f"attempt {ctx.attempt}"


@registry.task("f.patient")
async def patient(ctx: Any, payload: Any) -> str:
    """An async handler that sleeps `seconds` on the attempts in `long_on`; a cancel
    ends it (the `end` line is written either way)."""
    record(payload, "start", ctx)
    try:
        if ctx.attempt in payload.get("long_on", [1]):
            await asyncio.sleep(float(payload["seconds"]))
    finally:
        record(payload, "end", ctx)
    return f"attempt {ctx.attempt}"


@registry.task("f.claim_time")
async def claim_time(ctx: Any, payload: Any) -> str:
    """Appends when its claim was made, by the database's clock (the lease it set, less
    the lease's length in `lease_ms`), in ms, to the file named in `claims`."""
    claimed = int(ctx.task.lease_until_ms) - int(payload["lease_ms"])
    fd = os.open(payload["claims"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{claimed}\n".encode())
    finally:
        os.close(fd)
    return "ok"
