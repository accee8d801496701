"""Handlers and helper processes for bench/daemon.py.

`python -m bench.daemon_handlers preload TARGET N` submits N no-op tasks;
`... block TARGET FILE` submits one task that runs until FILE exists;
`... worker TARGET` serves the handlers with a bare `Worker` (the baseline).
TARGET is the JSON database section: {"path": ...} or {"dsn": ...}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import cairnqd
from cairnqd.registry import TaskRegistry

registry = TaskRegistry()


@registry.task("bench.noop")
async def noop(ctx: Any, payload: Any) -> None:
    return None


@registry.task("bench.stamp")
async def stamp(ctx: Any, payload: Any) -> dict[str, float]:
    """The wall clock as the handler starts: bench/idle.py times pickups by it."""
    return {"t": time.time()}


@registry.task("bench.record")
async def record(ctx: Any, payload: Any) -> None:
    """Appends `<task id> <attempt>` to the file in `log` (one atomic O_APPEND write)
    and sleeps `seconds`: bench/chaos.py counts executions from that file."""
    fd = os.open(payload["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{ctx.task_id} {ctx.attempt}\n".encode())
    finally:
        os.close(fd)
    await asyncio.sleep(float(payload["seconds"]))


@registry.task("bench.block")
async def block(ctx: Any, payload: Any) -> None:
    # Released by the bench process creating the file: no in-process event to await.
    while not os.path.exists(payload["until"]):  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(0.01)


def _store(target: dict[str, Any]) -> cairnqd.TaskStore:
    if "path" in target:
        return cairnqd.SQLiteStore(target["path"])
    # The pool a daemon child gets (`connections_per_child`), when the bench says so.
    return cairnqd.PostgresStore(target["dsn"], max_size=target.get("connections_per_child", 10))


async def _preload(target: dict[str, Any], n: int) -> None:
    """n no-op tasks in one transaction, so they all become visible at once."""
    client = cairnqd.CairnQ(_store(target))
    await client.connect()
    if n:
        await client.submit_many([{"name": "bench.noop"} for _ in range(n)])
    await client.close()


async def _block(target: dict[str, Any], until: str) -> None:
    client = cairnqd.CairnQ(_store(target))
    await client.submit("bench.block", {"until": until}, max_attempts=5)
    await client.close()


def _serve(target: dict[str, Any]) -> None:
    worker = cairnqd.Worker(_store(target), concurrency=8, poll_interval_ms=500)
    for name, registration in registry.handlers.items():
        worker.register(name, registration.fn)
    worker._owns_store = True  # serve() closes it on the way out
    worker.serve()


def main() -> None:
    command, target = sys.argv[1], json.loads(sys.argv[2])
    if command == "preload":
        asyncio.run(_preload(target, int(sys.argv[3])))
    elif command == "block":
        asyncio.run(_block(target, sys.argv[3]))
    else:
        _serve(target)


if __name__ == "__main__":
    main()
