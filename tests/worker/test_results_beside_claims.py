"""Results written beside the claim loop (`Settlement.write_due`, cairnqd/_settlement.py):
one batch per settle interval, the results queued meanwhile left for their own turn, and
none of them left behind when the worker drains them at its stop."""

from __future__ import annotations

import asyncio
import time

from cairnqd._inflight import InFlight, LoopState
from cairnqd._settlement import Settlement
from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.store.base import TaskStore


async def test_a_stop_writes_the_results_a_background_batch_left(store: TaskStore) -> None:
    client = CairnQ(store)
    for i in range(4):
        await client.submit("demo.echo", {"i": i})
    errors: list[BaseException] = []
    inflight = InFlight(30_000, lambda exc, _ctx: errors.append(exc), "w-beside")
    state = LoopState()
    # The loop's claims would carry queued results: `enqueue` leaves them queued.
    state.looping = state.has_handlers = True
    settlement = Settlement(
        store, inflight, state, concurrency=4, retry_backoff_ms=10, retry_backoff_max_ms=10
    )
    claimed = await store.claim(queues=["default"], worker_id="w-beside", limit=4)
    assert len(claimed) == 4
    contexts = [TaskContext(settlement, task) for task in claimed]
    inflight.hold(contexts, time.monotonic())
    for ctx in contexts[:2]:
        assert inflight.begin(ctx)
        settlement.enqueue(ctx, '"first"')
    settlement.write_due()  # the first two, in the background
    await asyncio.sleep(0)  # the writer takes its batch (on Postgres, and waits on it)
    for ctx in contexts[2:]:
        assert inflight.begin(ctx)
        settlement.enqueue(ctx, '"second"')  # while that write runs: not its batch
    await settlement.drain()
    tasks = [await client.get(task.id) for task in claimed]
    assert [(t.status, t.result) for t in tasks] == [
        ("succeeded", "first"),
        ("succeeded", "first"),
        ("succeeded", "second"),
        ("succeeded", "second"),
    ]
    assert errors == []
