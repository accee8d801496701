"""`Worker.wake_gate`: on SQLite, a worker whose sibling holds the group's wake role
(daemon/wakerole.py) claims only once it takes the role or its poll falls due; not
when a call of its own ends, nor again straight after a claim of its own. On Postgres
those claims stay: they run beside the sibling's. The gate here is a stand-in for the
role's lock, flipped by the test, around a real worker and store;
tests/daemon/test_wake_role.py runs the real lock between two daemon children."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from cairnqd.context import TaskContext
from cairnqd.limits import parse_limits
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.waiting import wait_for_async
from tests.support.worker import (
    POSTGRES_ONLY,
    SQLITE_ONLY,
    running,
    wait_status,
    wrap_method,
)

pytestmark = pytest.mark.timeout(60)


class Gate:
    """The role, held or not as the test says; counts the waits for it."""

    def __init__(self, *, holding: bool) -> None:
        self._taken = asyncio.Event()
        if holding:
            self._taken.set()
        self.waits = 0

    @property
    def holding(self) -> bool:
        return self._taken.is_set()

    def let_go(self) -> None:
        self._taken.clear()

    def take(self) -> None:
        self._taken.set()

    async def until_held(self, timeout_s: float) -> None:
        self.waits += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._taken.wait(), timeout_s)


def holding_worker(store: TaskStore, gate: Gate, *, poll_ms: int) -> tuple[Worker, dict[str, Any]]:
    worker = Worker(store, ["default"], poll_interval_ms=poll_ms, prefetch=0)
    worker.wake_gate = gate
    releases: dict[str, asyncio.Event] = {}

    @worker.task
    async def hold(ctx: TaskContext) -> None:
        await releases.setdefault(ctx.task_id, asyncio.Event()).wait()

    @worker.task
    async def noop(ctx: TaskContext) -> None:
        return None

    return worker, releases


class Claims:
    """Counts the worker's claims on its (real) store."""

    def __init__(self, store: TaskStore) -> None:
        self.count = 0
        wrap_method(store, "claim_session", self._counted)

    async def _counted(self, original: Any, *args: Any, **kwargs: Any) -> Any:
        self.count += 1
        return await original(*args, **kwargs)


@SQLITE_ONLY
async def test_a_call_ending_without_the_role_claims_nothing(store: TaskStore) -> None:
    gate = Gate(holding=True)
    worker, releases = holding_worker(store, gate, poll_ms=30_000)
    claims = Claims(store)
    async with running(worker, concurrency=1):
        first = await store.submit(name="hold")
        await wait_status(store, first.id, "running")
        # Full, the worker let go, and a sibling took the role; a task comes.
        gate.let_go()
        second = await store.submit(name="noop")
        claims_before, waits_before = claims.count, gate.waits
        releases.setdefault(first.id, asyncio.Event()).set()
        await wait_status(store, first.id, "succeeded")
        # Its slot is free, and it waits for the role. Before, its call ending made it
        # claim at once: it took the task the sibling was there to answer, or, more
        # often, found nothing.
        await wait_for_async("the worker to wait for the role", lambda: gate.waits > waits_before)
        assert claims.count == claims_before
        assert (await store.get(second.id)).status == "queued"
        # The sibling fills up and lets go: this worker takes the role and claims.
        gate.take()
        await wait_status(store, second.id, "succeeded")
    assert claims.count > claims_before


@POSTGRES_ONLY
async def test_on_postgres_a_call_ending_claims_beside_the_holder(store: TaskStore) -> None:
    gate = Gate(holding=True)
    worker, releases = holding_worker(store, gate, poll_ms=30_000)
    async with running(worker, concurrency=1):
        first = await store.submit(name="hold")
        await wait_status(store, first.id, "running")
        gate.let_go()
        second = await store.submit(name="noop")
        releases.setdefault(first.id, asyncio.Event()).set()
        # No role, no poll: the claim its call ending makes takes the task.
        await wait_status(store, second.id, "succeeded")
    assert not gate.holding


@SQLITE_ONLY
async def test_held_back_by_a_limit_without_the_role_the_worker_still_settles_and_claims(
    store: TaskStore,
) -> None:
    """A limit held the worker's last claim back; the role went to a sibling. Its own
    call ending must still write the result (which gives the room back) and claim once
    there is room: every worker waits for a limit's room itself. Deferring to the
    sibling here kept the result unwritten and the room taken, so the sibling, held
    back too, never got it either: nothing ran again."""
    store.use_limits(parse_limits({"one": {"queues": ["default"], "concurrency": 1}}))
    gate = Gate(holding=True)
    worker, releases = holding_worker(store, gate, poll_ms=30_000)
    async with running(worker, concurrency=2):
        first = await store.submit(name="hold")
        await wait_status(store, first.id, "running")
        second = await store.submit(name="noop")
        await wait_for_async(
            "the limit to hold a claim back", lambda: store.room_wait_ms(0.0) is not None
        )
        gate.let_go()
        releases.setdefault(first.id, asyncio.Event()).set()
        await wait_status(store, first.id, "succeeded", within=10)
        await wait_status(store, second.id, "succeeded", within=10)


async def test_without_the_role_the_poll_still_claims(store: TaskStore) -> None:
    gate = Gate(holding=False)
    worker, _ = holding_worker(store, gate, poll_ms=300)
    async with running(worker, concurrency=2):
        await wait_for_async("the worker to wait for the role", lambda: gate.waits > 0)
        task = await store.submit(name="noop")
        # Never given the role (a sibling that holds it and never claims, its event
        # loop blocked by a handler): the poll finds the task.
        await wait_status(store, task.id, "succeeded")
    assert not gate.holding
