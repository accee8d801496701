"""A public `cairnq` SDK Worker's attempts are recorded on both dialects, though it
writes only the protocol's `cairnq_tasks`: the triggers of cairnqd_0010_attempts.sql
record each attempt whoever runs it (docs/operations.md, "Reading attempt history")."""

from __future__ import annotations

import asyncio
from typing import Any

import cairnq
import pytest

import cairnqd
from tests.support.waiting import wait_for_async


@pytest.mark.timing
async def test_their_worker_attempts_are_recorded(theirs: Any, ours: cairnqd.CairnQ) -> None:
    worker = cairnq.Worker(
        theirs.store, ["default"], poll_interval_ms=20, retry_backoff_ms=1,
        retry_backoff_max_ms=1,
    )  # fmt: skip

    @worker.task("report.build")
    async def build(ctx: Any, payload: Any) -> str:
        if ctx.attempt == 1:
            raise RuntimeError("first try fails")
        return "built"

    task = await ours.submit("report.build", {"n": 1}, max_attempts=3)
    running = asyncio.create_task(worker.run())
    try:
        done = await ours.wait(task.id, timeout_ms=20_000)
    finally:
        worker.stop()
        await running
    assert (done.status, done.attempt) == ("succeeded", 2)

    records = await ours.store.attempts.of(task.id)
    assert [(r.attempt, r.outcome, r.worker_id) for r in records] == [
        (1, "failed", worker.worker_id),
        (2, "succeeded", worker.worker_id),
    ]
    first = records[0]
    assert first.error is not None and first.error["message"] == "first try fails"
    # A public-SDK worker id names no host.
    assert first.host is None
    assert all(r.finished_at_ms is not None for r in records)
    # Its lease lost to our claim is recorded too.
    lost = await theirs.submit("report.lost", {})
    claimed = await theirs.store.claim(queues=["default"], worker_id="their-dead", lease_ms=50)
    assert [t.id for t in claimed] == [lost.id]
    await wait_for_async(
        "our claim to recover their lease",
        lambda: ours.store.claim(queues=["default"], worker_id="ours", names=["report.lost"]),
    )
    assert [(r.attempt, r.outcome, r.worker_id) for r in await ours.store.attempts.of(lost.id)] == [
        (1, "lease_lost", "their-dead"),
        (2, None, "ours"),
    ]
