"""`release_worker`: the daemon's hand-back of a dead child's tasks, on both dialects.

Tasks the worker held without starting get back the attempt their claim spent; every
other task it held gets lease recovery's outcome."""

from __future__ import annotations

from cairnqd.store.base import TaskStore


async def test_unstarted_tasks_get_their_attempt_back(store: TaskStore) -> None:
    waiting = await store.submit(name="n", max_attempts=3)
    canceled = await store.submit(name="n", max_attempts=3)
    started = await store.submit(name="n", max_attempts=3)
    last = await store.submit(name="n", max_attempts=1)
    stale = await store.submit(name="n", max_attempts=3)
    claimed = await store.claim(queues=["default"], worker_id="w1", limit=10)
    assert {t.attempt for t in claimed} == {1}
    await store.cancel(canceled.id)
    before = await store.get(waiting.id)
    assert before is not None

    rows = await store.release_worker(
        "w1",
        message="its worker process exited",
        # `stale` is listed under another attempt, so it counts as started.
        unstarted=[(waiting.id, 1), (canceled.id, 1), (stale.id, 2), ("task_nope", 1)],
    )
    assert sorted((r["id"], r["status"]) for r in rows) == sorted(
        [
            (waiting.id, "queued"),
            (canceled.id, "canceled"),
            (started.id, "queued"),
            (last.id, "failed"),
            (stale.id, "queued"),
        ]
    )
    got = {t.id: t for t in [await store.get(i) for i in (waiting.id, canceled.id, started.id,
                                                          last.id, stale.id)] if t}  # fmt: skip
    assert (got[waiting.id].attempt, got[waiting.id].worker_id) == (0, None)
    assert got[waiting.id].run_at_ms == before.run_at_ms, "it keeps its place in the queue"
    assert got[waiting.id].lease_until_ms is None
    assert got[canceled.id].attempt == 1 and got[canceled.id].completed_at_ms is not None
    assert got[started.id].attempt == 1 and got[stale.id].attempt == 1
    error = got[last.id].error
    assert error is not None and error["code"] == "lease_expired"

    again = await store.claim(queues=["default"], worker_id="w2", limit=10)
    assert {t.id: t.attempt for t in again} == {waiting.id: 1, started.id: 2, stale.id: 2}


async def test_another_workers_tasks_are_untouched(store: TaskStore) -> None:
    task = await store.submit(name="n")
    await store.claim(queues=["default"], worker_id="w1", limit=1)
    assert await store.release_worker("w2", message="x", unstarted=[(task.id, 1)]) == []
    row = await store.get(task.id)
    assert row is not None and (row.status, row.attempt, row.worker_id) == ("running", 1, "w1")
