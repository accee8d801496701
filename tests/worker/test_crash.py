"""A worker process killed mid-task loses nothing: once the lease lapses another
worker recovers the tasks and runs them as attempt 2 (docs/protocol.md §6.7, §8.6)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.worker import eventually, reap, running, start_worker_process, wait_all

pytestmark = pytest.mark.timeout(60)

CRASH_SCRIPT = """
worker = make_worker(poll_interval_ms=20, lease_ms=1000, concurrency=3)

@worker.task
async def fragile(ctx, payload):
    mark("started-%d" % payload["i"])
    await wait_flag("never")
    return "unreachable"

worker.serve()
"""


async def test_sigkill_mid_task_is_recovered_by_another_worker(
    store: TaskStore, client: CairnQ, dialect: str, db_target: str, tmp_path: Path
) -> None:
    tasks = await client.submit_many(
        [{"name": "fragile", "payload": {"i": i}, "max_attempts": 3} for i in range(3)]
    )
    ids = [t.id for t in tasks]
    flags = tmp_path / "flags"
    proc = start_worker_process(
        CRASH_SCRIPT, dialect=dialect, target=db_target, flags=flags, tmp=tmp_path
    )
    try:
        await eventually(
            lambda: (
                all((flags / f"started-{i}").exists() for i in range(3)) or proc.poll() is not None
            ),
            what="the child to start all three tasks",
        )
        assert proc.poll() is None, reap(proc)
        proc.send_signal(signal.SIGKILL)
    finally:
        code, _, err = reap(proc)
    assert code == -signal.SIGKILL, err

    victims = [await store.get(i) for i in ids]
    dead_worker_ids = {v.worker_id for v in victims if v is not None}
    assert all(v is not None and (v.status, v.attempt) == ("running", 1) for v in victims)
    assert len(dead_worker_ids) == 1

    rescuer = Worker(store, ["default"], poll_interval_ms=50, concurrency=3)
    runs: list[tuple[str, int]] = []

    @rescuer.task
    async def fragile(ctx: TaskContext, payload: Any) -> str:
        runs.append((ctx.task_id, ctx.attempt))
        return f"recovered {payload['i']}"

    async with running(rescuer):
        done = await wait_all(store, ids)
    assert [(t.status, t.attempt, t.result) for t in done] == [
        ("succeeded", 2, f"recovered {i}") for i in range(3)
    ]
    assert all(t.worker_id == rescuer.worker_id for t in done)
    assert sorted(runs) == sorted((i, 2) for i in ids), "each task ran exactly once more"
    assert (await store.stats("default"))["default"] == {
        "queued": 0,
        "running": 0,
        "succeeded": 3,
        "failed": 0,
        "canceled": 0,
    }
