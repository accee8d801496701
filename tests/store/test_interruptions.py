"""`release_worker` with interrupted tasks: the operator's stops give the attempt back,
at most a capped number of times per task, on both dialects."""

from __future__ import annotations

from cairnqd.store.base import TaskStore


async def _claim_one(store: TaskStore, worker_id: str) -> tuple[str, int]:
    [task] = await store.claim(queues=["default"], worker_id=worker_id, limit=1)
    return task.id, task.attempt


async def test_interrupted_tasks_get_their_attempt_back_up_to_the_cap(store: TaskStore) -> None:
    task = await store.submit(name="n", max_attempts=2)
    for round_ in range(1, 3):
        worker = f"w{round_}"
        claimed = await _claim_one(store, worker)
        assert claimed == (task.id, 1)
        await store.progress(task_id=task.id, worker_id=worker, progress=0.5, message="half")
        rows = await store.release_worker(
            worker, message="x", interrupted=[claimed, claimed], interruption_cap=2
        )
        assert [(r["id"], r["status"], r.get("interrupted")) for r in rows] == [
            (task.id, "queued", True)
        ]
        row = await store.get(task.id)
        assert row is not None
        assert (row.status, row.attempt, row.worker_id) == ("queued", 0, None)
        assert (row.progress, row.message) == (None, None), "a requeue clears progress"

    # The cap is spent: the third interruption costs the attempt, as a crash does.
    claimed = await _claim_one(store, "w3")
    rows = await store.release_worker("w3", message="x", interrupted=[claimed], interruption_cap=2)
    assert [(r["id"], r["status"], r.get("interrupted")) for r in rows] == [
        (task.id, "queued", None)
    ]
    row = await store.get(task.id)
    assert row is not None and (row.status, row.attempt) == ("queued", 1)
    claimed = await _claim_one(store, "w4")
    assert claimed == (task.id, 2)
    rows = await store.release_worker("w4", message="x", interrupted=[claimed], interruption_cap=2)
    assert [(r["id"], r["status"]) for r in rows] == [(task.id, "failed")]
    row = await store.get(task.id)
    assert row is not None and row.error is not None and row.error["code"] == "lease_expired"


async def test_only_the_listed_attempt_of_that_worker_is_given_back(store: TaskStore) -> None:
    cut = await store.submit(name="n", max_attempts=3)
    crashed = await store.submit(name="n", max_attempts=3)
    canceled = await store.submit(name="n", max_attempts=3)
    await store.claim(queues=["default"], worker_id="w1", limit=3)
    await store.cancel(canceled.id)
    rows = await store.release_worker(
        "w1",
        message="x",
        # `crashed` is listed at another attempt; another worker's ids change nothing.
        interrupted=[(cut.id, 1), (crashed.id, 2), (canceled.id, 1)],
        interruption_cap=3,
    )
    outcome = {r["id"]: (r["status"], r.get("interrupted")) for r in rows}
    assert outcome == {
        cut.id: ("queued", True),
        crashed.id: ("queued", None),
        canceled.id: ("canceled", None),
    }
    attempts = {i: t.attempt for i in (cut.id, crashed.id) if (t := await store.get(i))}
    assert attempts == {cut.id: 0, crashed.id: 1}


async def test_without_a_cap_nothing_is_given_back(store: TaskStore) -> None:
    await store.submit(name="n")
    claimed = await _claim_one(store, "w1")
    rows = await store.release_worker("w1", message="x", interrupted=[claimed])
    assert [r.get("interrupted") for r in rows] == [None]
    row = await store.get(claimed[0])
    assert row is not None and row.attempt == 1
