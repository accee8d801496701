"""A task with a history to show: failed, then lost its lease, then succeeded, written
through a real store (the triggers of cairnqd_0010_attempts.sql record each attempt)."""

from __future__ import annotations

from cairnqd.store.base import TaskStore
from tests.support.waiting import wait_for_async

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "handlers.py", line 7, in resize\n'
    "    raise ValueError('bad pixel')\n"
    "ValueError: bad pixel\n"
)
BOOM = {
    "type": "ValueError",
    "code": "handler_error",
    "message": "bad pixel",
    "retryable": True,
    "details": {"traceback": TRACEBACK},
}
FIRST_WORKER = "hostA:images.0:01JWORKERA"
LOST_WORKER = "worker_01JPUBLIC"
LAST_WORKER = "hostC:images.1:01JWORKERC"


async def _claim_one(store: TaskStore, worker_id: str, lease_ms: int) -> None:
    claimed = await store.claim(queues=["default"], worker_id=worker_id, lease_ms=lease_ms)
    assert len(claimed) == 1, claimed


async def failed_lost_succeeded(store: TaskStore, name: str = "image.resize") -> str:
    """Submit a task and run it three times: attempt 1 fails with `BOOM`, attempt 2's
    lease runs out and is recovered, attempt 3 succeeds. Its id."""
    task = await store.submit(name=name, max_attempts=5)
    await _claim_one(store, FIRST_WORKER, 30_000)
    await store.fail(task_id=task.id, worker_id=FIRST_WORKER, error=BOOM, delay_ms=0)
    await _claim_one(store, LOST_WORKER, 30)
    await wait_for_async("the lease to be recovered", store.recover_leases)
    await _claim_one(store, LAST_WORKER, 30_000)
    await store.complete(task_id=task.id, worker_id=LAST_WORKER, result={"ok": True})
    return task.id
