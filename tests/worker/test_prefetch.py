"""cairnqd's `prefetch`: claim ahead of free slots, run everything, never more than
`concurrency` calls at once, and finish prefetched tasks when stopped."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.worker.helpers import ErrorLog, eventually, running, wait_all

pytestmark = pytest.mark.timeout(60)


def test_prefetch_must_be_a_non_negative_int(store: TaskStore) -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="prefetch"):
            Worker(store, ["default"], prefetch=bad)  # type: ignore[arg-type]


async def test_prefetch_claims_ahead_but_runs_at_most_concurrency(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = Worker(
        store, ["default"], concurrency=2, prefetch=20, poll_interval_ms=50, on_error=errors
    )
    in_flight = 0
    peak = 0

    @worker.task("job")
    async def job(ctx: Any, payload: Any) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return int(payload["i"])

    tasks = await client.submit_many([{"name": "job", "payload": {"i": i}} for i in range(40)])
    async with running(worker):

        async def prefetched() -> bool:
            return len(await client.list(status="running", limit=100)) > 2

        # More tasks hold a lease than run at once: the backlog is real.
        await eventually(prefetched, what="tasks claimed ahead of free slots")
        done = await wait_all(store, [t.id for t in tasks], "succeeded")
    assert [t.result for t in done] == list(range(40))
    assert peak <= 2
    assert not errors.calls


async def test_stop_runs_prefetched_tasks_instead_of_stranding_them(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = Worker(
        store, ["default"], concurrency=1, prefetch=10, poll_interval_ms=50, on_error=errors
    )
    gate = asyncio.Event()

    @worker.task("slow")
    async def slow(ctx: Any, payload: Any) -> None:
        await gate.wait()

    tasks = await client.submit_many([{"name": "slow"} for _ in range(6)])
    async with running(worker):

        async def claimed_all() -> bool:
            return len(await client.list(status="running", limit=100)) == 6

        await eventually(claimed_all, what="all six claimed (one running, five prefetched)")
        worker.stop()
        gate.set()
    done = await wait_all(store, [t.id for t in tasks], "succeeded")
    assert all(t.attempt == 1 for t in done)
    assert not errors.calls
