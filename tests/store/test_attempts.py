"""Attempt history on both dialects: the triggers of cairnqd_0010_attempts.sql record
each attempt however it ends, whoever settles it, and a task's records go with it."""

from __future__ import annotations

import pytest

from cairnqd.store.base import TaskStore
from tests.support.store import query
from tests.support.waiting import wait_for_async

BOOM = {
    "type": "ValueError",
    "code": "handler_error",
    "message": "boom",
    "retryable": True,
    "details": {
        "traceback": 'Traceback (most recent call last):\n  File "h.py"\nValueError: boom\n'
    },
}


async def _claim_one(store: TaskStore, worker_id: str, lease_ms: int = 30_000) -> str:
    claimed = await store.claim(queues=["default"], worker_id=worker_id, lease_ms=lease_ms)
    assert len(claimed) == 1
    return claimed[0].id


@pytest.mark.timing
async def test_failed_lease_lost_then_succeeded(store: TaskStore) -> None:
    task = await store.submit(name="n", max_attempts=5)
    await _claim_one(store, "hostA:default.0:X")
    await store.fail(task_id=task.id, worker_id="hostA:default.0:X", error=BOOM, delay_ms=0)
    # The second attempt's lease runs out; the next claim recovers it.
    await _claim_one(store, "worker_B", lease_ms=50)

    async def recovered() -> list[object]:
        return await store.recover_leases()

    await wait_for_async("the lease to be recovered", recovered)
    await _claim_one(store, "hostC:default.1:Y")
    await store.complete(task_id=task.id, worker_id="hostC:default.1:Y", result={"ok": 1})

    records = await store.attempts.of(task.id)
    assert [(r.attempt, r.outcome, r.worker_id, r.host) for r in records] == [
        (1, "failed", "hostA:default.0:X", "hostA"),
        (2, "lease_lost", "worker_B", None),
        (3, "succeeded", "hostC:default.1:Y", "hostC"),
    ]
    first, lost, done = records
    assert first.error is not None and first.error["message"] == "boom"
    assert "ValueError: boom" in first.error["details"]["traceback"]
    # The row's error is still the first attempt's; no later record repeats it.
    assert lost.error is None and done.error is None
    for r in records:
        assert r.finished_at_ms is not None and r.finished_at_ms >= r.started_at_ms
    assert first.finished_at_ms is not None and first.finished_at_ms <= lost.started_at_ms
    row = await store.get(task.id)
    assert row is not None and row.error is not None and row.status == "succeeded"


async def test_heartbeats_and_progress_leave_the_open_record_alone(store: TaskStore) -> None:
    task = await store.submit(name="n")
    await _claim_one(store, "w1")
    await store.heartbeat(task_id=task.id, worker_id="w1", lease_ms=60_000)
    await store.progress(task_id=task.id, worker_id="w1", progress=0.5, message="half")
    records = await store.attempts.of(task.id)
    assert [(r.attempt, r.outcome, r.finished_at_ms) for r in records] == [(1, None, None)]
    assert records[0].outcome_shown == "running"


async def test_identical_failures_and_terminal_failure(store: TaskStore) -> None:
    task = await store.submit(name="n", max_attempts=2)
    for _ in range(2):
        await _claim_one(store, "w1")
        await store.fail(task_id=task.id, worker_id="w1", error=BOOM, delay_ms=0)
    records = await store.attempts.of(task.id)
    # The same envelope twice is still two failures, each with its error.
    assert [(r.attempt, r.outcome) for r in records] == [(1, "failed"), (2, "failed")]
    assert all(r.error is not None and r.error["message"] == "boom" for r in records)
    row = await store.get(task.id)
    assert row is not None and row.status == "failed"


async def test_cancel_and_retry_with_reset(store: TaskStore) -> None:
    task = await store.submit(name="n", max_attempts=1)
    await _claim_one(store, "w1")
    await store.cancel(task.id)
    await store.complete(task_id=task.id, worker_id="w1", result=None)
    assert await store.retry(task.id, reset_attempt=True) is not None
    await _claim_one(store, "w2")
    await store.complete(task_id=task.id, worker_id="w2", result=1)
    records = await store.attempts.of(task.id)
    # A reset runs attempt 1 again: a record of its own, in the order they ran.
    assert [(r.attempt, r.outcome, r.worker_id) for r in records] == [
        (1, "canceled", "w1"),
        (1, "succeeded", "w2"),
    ]


async def test_hand_back_names_why(store: TaskStore) -> None:
    started = await store.submit(name="n", max_attempts=3)
    last = await store.submit(name="n", max_attempts=1)
    unstarted = await store.submit(name="n", max_attempts=3)
    claimed = await store.claim(queues=["default"], worker_id="h:g.0:Z", limit=10)
    assert len(claimed) == 3
    await store.release_worker(
        "h:g.0:Z", message="stalled", unstarted=[(unstarted.id, 1)], why="stall"
    )
    got = {t: await store.attempts.of(t) for t in (started.id, last.id, unstarted.id)}
    assert [(r.outcome, r.detail, r.error) for r in got[started.id]] == [("aborted", "stall", None)]
    (final,) = got[last.id]
    assert (final.outcome, final.detail) == ("aborted", "stall")
    assert final.error is not None and final.error["code"] == "lease_expired"
    # Claimed ahead but never started: its attempt was given back, so no record.
    assert got[unstarted.id] == []
    again = await store.claim(queues=["default"], worker_id="h:g.1:Q", limit=10)
    assert {t.id for t in again} == {started.id, unstarted.id}
    await store.release_worker("h:g.1:Q", message="bye", why="shutdown")
    records = await store.attempts.of(unstarted.id)
    assert [(r.attempt, r.outcome, r.detail) for r in records] == [(1, "handed_back", "shutdown")]


async def test_max_run_failures_are_aborts(store: TaskStore) -> None:
    task = await store.submit(name="n", max_attempts=5)
    error = {"type": "MaxRunExceeded", "code": "max_run_exceeded", "message": "too long",
             "retryable": True, "details": {"max_run_s": 1.0}}  # fmt: skip
    # The daemon's envelope twice (the same both times), then a worker's own timeout.
    for envelope in (error, error, {**error, "code": "handler_timeout"}):
        await _claim_one(store, "w1")
        await store.fail(task_id=task.id, worker_id="w1", error=envelope)
    records = await store.attempts.of(task.id)
    assert [(r.outcome, r.detail) for r in records] == [("aborted", "max_run")] * 3
    assert records[0].outcome_shown == "aborted (max_run)"
    assert [r.error["code"] for r in records if r.error] == [
        "max_run_exceeded", "max_run_exceeded", "handler_timeout"
    ]  # fmt: skip
    # Handed back while the row still holds the last abort's error: not an abort.
    await _claim_one(store, "h:g.0:W")
    await store.release_worker("h:g.0:W", message="gone", why="worker_exit")
    last = (await store.attempts.of(task.id))[-1]
    assert (last.attempt, last.outcome, last.detail, last.error) == (
        4, "handed_back", "worker_exit", None
    )  # fmt: skip


async def test_purge_and_discard_remove_the_records(store: TaskStore) -> None:
    kept = await store.submit(name="n")
    gone = await store.submit(name="n")
    for _ in range(2):
        await _claim_one(store, "w1")
    await store.complete(task_id=gone.id, worker_id="w1", result=None)
    # A task that ended this millisecond is not older than 0 ms yet: wait for the next.
    purged = await wait_for_async(
        "the finished task to be purged", lambda: store.purge(older_than_ms=0)
    )
    assert purged == [gone.id]
    assert await store.attempts.of(gone.id) == []
    assert len(await store.attempts.of(kept.id)) == 1
    await store.fail(task_id=kept.id, worker_id="w1", error=BOOM, retryable=False)
    assert await store.dashboard.discard_failed([kept.id]) == [kept.id]
    assert await store.attempts.of(kept.id) == []


async def test_a_hand_written_update_of_both_kinds(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    """One UPDATE that moves a queued row to running while another runs on: the new
    attempt is opened and the running one keeps its single open record."""
    running = await store.submit(name="n", queue="a")
    await store.claim(queues=["a"], worker_id="w1")
    queued = await store.submit(name="n", queue="b")
    query(
        dialect,
        db_target,
        "update cairnq_tasks set status = 'running', worker_id = 'w2', "
        "attempt = case when status = 'queued' then attempt + 1 else attempt end, "
        "lease_until_ms = updated_at_ms + 60000 where id in (?, ?)",
        [running.id, queued.id],
    )
    assert [(r.attempt, r.worker_id, r.outcome) for r in await store.attempts.of(queued.id)] == [
        (1, "w2", None)
    ]
    assert [(r.attempt, r.worker_id, r.outcome) for r in await store.attempts.of(running.id)] == [
        (1, "w1", None)
    ]
