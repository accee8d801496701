"""A claim the database holds up past its tasks' stop point still runs them, once.

The worker counts a claimed task's lease from when the claim was sent (the database set
its own lease later, when the statement ran), and starts a task only before a fifth of
the lease is left. A claim that waited on the database that long (another client held
SQLite's write lock, or a Postgres `LOCK TABLE`) came back with tasks too close to
that local deadline to start. They were let go at once, although the database had just
given them to this worker for a whole lease: they stayed `running` until that lease
ended, and recovery then counted the attempt the claim had spent. A task of one
attempt failed as `lease_expired` without its handler ever being called.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.locks import database_locked_async
from tests.support.worker import ErrorLog, running, wait_status, wrap_method

pytestmark = pytest.mark.timeout(120)

LEASE_MS = 1000
# Longer than the whole lease: the claim comes back past its local deadline, which the
# database's lease (set when the claim ran, after the lock went) is not.
STALL_S = 1.6


def _stall_first_claim(store: TaskStore, dialect: str, db_target: str) -> list[float]:
    """Have the first claim that finds work wait `STALL_S` on another client's lock;
    the list gets how long it took once it is back."""
    took: list[float] = []

    async def stalled(original: Any, *args: Any, **kwargs: Any) -> Any:
        if took:
            return await original(*args, **kwargs)
        loop = asyncio.get_running_loop()
        began = loop.time()
        async with database_locked_async(dialect, db_target, STALL_S):
            claim = asyncio.ensure_future(original(*args, **kwargs))
        claimed = await claim
        took.append(loop.time() - began)
        return claimed

    wrap_method(store, "claim_session", stalled)
    return took


@pytest.mark.parametrize("prefetch", [0, 4])
async def test_a_claim_held_up_past_the_stop_point_still_runs_its_tasks(
    store: TaskStore, client: CairnQ, dialect: str, db_target: str, prefetch: int
) -> None:
    errors = ErrorLog()
    worker = Worker(
        store, lease_ms=LEASE_MS, poll_interval_ms=50, prefetch=prefetch, on_error=errors
    )
    ran: list[tuple[str, int]] = []

    @worker.task("once")
    async def once(ctx: TaskContext, payload: Any) -> str:
        ran.append((ctx.task_id, ctx.attempt))
        return "ran"

    tasks = [await client.submit("once", {"n": n}, max_attempts=1) for n in range(2)]
    took = _stall_first_claim(store, dialect, db_target)
    async with running(worker):
        done = [await wait_status(store, t.id, within=30) for t in tasks]
    assert took and took[0] >= LEASE_MS / 1000, took
    for task in done:
        assert (task.status, task.attempt, task.result) == ("succeeded", 1, "ran"), task
    assert sorted(ran) == sorted((t.id, 1) for t in tasks)
