"""The per-queue counters on both dialects: adds from several writers add up, a chart's
read finds its width's rows, pruning keeps what charts show, and a worker writes the
outcomes and waits of its tasks when it stops (cairnqd/queue_counts.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.queue_counts import KEEP_MS, WAIT, CountRow, bucket_of, rows_of
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.worker import running, wait_all

pytestmark = pytest.mark.timeout(60)

HOUR = 3_600_000


async def test_adds_from_several_writers_add_up(store: TaskStore) -> None:
    start = 100 * HOUR
    rows = [
        CountRow(60, start, "mail", "succeeded", 3, 2),
        CountRow(3600, start, "mail", "succeeded", 3, 2),
        CountRow(60, start, "mail", WAIT, 0, 1),
    ]
    await store.queue_counts.add(rows)
    await asyncio.gather(*(store.queue_counts.add(rows[:1]) for _ in range(5)))
    minutes = await store.queue_counts.read(60, start)
    assert sorted((r.series, r.n) for r in minutes) == [("succeeded", 12), (WAIT, 1)]
    assert [r.n for r in await store.queue_counts.read(3600, start)] == [2]
    assert await store.queue_counts.read(60, start + 60_000) == []


async def test_a_width_outside_the_three_is_refused(store: TaskStore) -> None:
    with pytest.raises(ValueError, match="width_s must be one of 60, 900, 3600, got 30"):
        await store.queue_counts.read(30, 0)


async def test_prune_keeps_what_each_width_shows(store: TaskStore) -> None:
    now = 1000 * HOUR
    kept = [
        CountRow(width, now - KEEP_MS[width] + width * 1000, "q", "failed", 0, 1)
        for width in (60, 900, 3600)
    ]
    gone = [
        CountRow(width, now - KEEP_MS[width] - width * 1000, "q", "failed", 0, 1)
        for width in (60, 900, 3600)
    ]
    await store.queue_counts.add(kept + gone)
    await store.queue_counts.prune(now)
    for row in kept:
        assert [r.start_ms for r in await store.queue_counts.read(row.width_s, 0)] == [row.start_ms]


async def test_a_worker_counts_its_outcomes_and_waits(store: TaskStore) -> None:
    client = CairnQ(store)
    worker = Worker(
        store, ["mail", "other"], concurrency=4, poll_interval_ms=50, retry_backoff_ms=0
    )

    @worker.task("ok")
    async def ok(ctx: Any, payload: Any) -> None:
        await asyncio.sleep(0.02)

    @worker.task("bad")
    async def bad(ctx: Any, payload: Any) -> None:
        raise RuntimeError("no")

    before = int(time.time() * 1000)
    good = await client.submit_many([{"name": "ok", "queue": "mail"} for _ in range(6)])
    failing = await client.submit("bad", queue="other", max_attempts=2)
    async with running(worker):
        await wait_all(store, [t.id for t in good], "succeeded")
        await wait_all(store, [failing.id], "failed")
    # The worker wrote its counts as it stopped; every width holds the same totals.
    for width in (60, 900, 3600):
        rows = await store.queue_counts.read(width, before - before % (width * 1000))
        totals: dict[tuple[str, str], int] = {}
        for r in rows:
            totals[r.queue, r.series] = totals.get((r.queue, r.series), 0) + r.n
        assert totals == {
            ("mail", "succeeded"): 6,
            ("mail", WAIT): 6,
            ("other", "retried"): 1,
            ("other", "failed"): 1,
            ("other", WAIT): 2,
        }, width
    minutes = await store.queue_counts.read(60, before - before % 60_000)
    # The handlers slept 20 ms: their run times fall in 20 ms's bin or just above.
    runs = [r.bucket for r in minutes if r.series == "succeeded"]
    assert min(runs) >= bucket_of(20)


async def test_a_worker_told_to_keep_none_writes_none(store: TaskStore) -> None:
    client = CairnQ(store)
    worker = Worker(store, ["default"], poll_interval_ms=50, keep_counts=False)

    @worker.task("ok")
    async def ok(ctx: Any, payload: Any) -> None:
        return None

    task = await client.submit("ok")
    async with running(worker):
        await wait_all(store, [task.id], "succeeded")
    assert await store.queue_counts.read(60, 0) == []


def test_rows_of_an_empty_tally_write_nothing() -> None:
    assert rows_of({}) == []


async def test_a_worker_forgets_rows_older_than_any_chart(store: TaskStore) -> None:
    now = int(time.time() * 1000)
    old = CountRow(60, now - KEEP_MS[60] - 3_600_000, "q", "succeeded", 0, 1)
    await store.queue_counts.add([old])
    client = CairnQ(store)
    worker = Worker(store, ["default"], poll_interval_ms=50)

    @worker.task("ok")
    async def ok(ctx: Any, payload: Any) -> None:
        return None

    task = await client.submit("ok")
    async with running(worker):
        await wait_all(store, [task.id], "succeeded")
    assert [r.queue for r in await store.queue_counts.read(60, 0)] == ["default", "default"]
