"""A Postgres claim sent in one flight (cairnqd/store/postgres/flight.py): a limited
hand-over (results, the room given back, the next claim) takes one round trip; a
caller cancelled after the flight left sees the server commit the claim all the same,
so its tasks (and their room) must come back at once, attempt restored, not after
their lease."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

import cairnqd.store.limits
import cairnqd.store.postgres.store
from cairnqd import CairnQ
from cairnqd._protocol import Statement
from cairnqd.limits import parse_limits
from cairnqd.store.base import ClaimDraw, OneDraw, Row
from cairnqd.store.postgres import PostgresStore
from tests.faults.proxy import FaultProxy
from tests.support.waiting import wait_for_async

#: Each way, so a round trip through the proxy takes twice this.
DELAY_S = 0.3


def task_row(dsn: str, task_id: str) -> tuple[Any, ...]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "select status, attempt, worker_id, lease_until_ms from cairnq_tasks where id = %s",
            (task_id,),
        ).fetchone()
        assert row is not None
        return tuple(row)


async def test_a_claim_cancelled_after_its_flight_left_hands_its_tasks_back(
    pg_proxy: FaultProxy, pg_dsn: str
) -> None:
    async with CairnQ(PostgresStore(pg_dsn)) as direct:
        first = await direct.submit("demo.echo", {})
        second = await direct.submit("demo.echo", {})
    store = PostgresStore(pg_proxy.dsn(pg_dsn), listen=False)
    await store.connect()
    try:
        # A first claim recovers expired leases, as a claim does once a second; with
        # that done, the next claim (one draw, nothing to wait on) goes in one flight.
        claimed = await store.claim(queues=["default"], worker_id="w-flight")
        assert [t.id for t in claimed] == [first.id]
        store.claim_recovery_every_s = 3600
        pg_proxy.delay(DELAY_S)
        claiming = asyncio.ensure_future(store.claim(queues=["default"], worker_id="w-flight"))
        # The flight reached the server and committed; its answer is still on the way.
        await wait_for_async(
            "the flight's commit", lambda: task_row(pg_dsn, second.id)[0] == "running"
        )
        assert not claiming.done()
        claiming.cancel()
        with pytest.raises(asyncio.CancelledError):
            await claiming
        status, attempt, worker_id, lease = task_row(pg_dsn, second.id)
        assert (status, attempt, worker_id, lease) == ("queued", 0, None, None)
        # The first task, claimed before and never settled, is untouched.
        assert task_row(pg_dsn, first.id)[:3] == ("running", 1, "w-flight")
    finally:
        pg_proxy.forward()
        await store.close()


async def test_a_claim_alone_goes_as_one_statement_and_with_results_in_a_transaction(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that carries no results is a single UPDATE, a transaction by itself: no
    BEGIN and COMMIT around it. With results, the two statements go in one pipeline,
    one implicit transaction, also without BEGIN and COMMIT: a claim that fails there
    leaves the results unwritten, and the connection fit for the next claim."""
    sent: list[tuple[tuple[str, ...], list[str]]] = []
    fly = cairnqd.store.postgres.store.claim_in_one_flight

    async def observed(conn: Any, begin: Any, steps: Any, *args: Any) -> Any:
        sent.append((tuple(begin), [stmt.name for stmt, _ in steps]))
        return await fly(conn, begin, steps, *args)

    monkeypatch.setattr(cairnqd.store.postgres.store, "claim_in_one_flight", observed)
    async with CairnQ(PostgresStore(pg_dsn)) as direct:
        ids = [(await direct.submit("demo.echo", {})).id for _ in range(3)]
    store = PostgresStore(pg_dsn, listen=False)
    await store.connect()
    try:
        # The first claim recovers expired leases first: not a flight.
        assert [t.id for t in await store.claim(queues=["default"], worker_id="w")] == ids[:1]
        store.claim_recovery_every_s = 3600
        assert [t.id for t in await store.claim(queues=["default"], worker_id="w")] == ids[1:2]
        claimed = await store.claim_session(
            queues=["default"], worker_id="w", names=None, plan=OneDrawOf(4),
            settle=[(ids[0], None, 1)],
        )  # fmt: skip
        assert claimed is not None and [t.id for t in claimed] == ids[2:]
        # The claim after a settle fails at the server: the settle is undone with it.
        failing = Statement("failing_claim", "select 1 / 0", ())
        monkeypatch.setattr(
            cairnqd.store.postgres.store,
            "claim_in_one_flight",
            lambda conn, begin, steps, *args: fly(conn, begin, [steps[0], (failing, {})], *args),
        )
        with pytest.raises(psycopg.errors.DivisionByZero):
            await store.claim_session(
                queues=["default"], worker_id="w", names=None, plan=OneDrawOf(4),
                settle=[(ids[1], None, 1)],
            )  # fmt: skip
        assert task_row(pg_dsn, ids[1])[:3] == ("running", 1, "w")
        monkeypatch.setattr(cairnqd.store.postgres.store, "claim_in_one_flight", observed)
        claimed = await store.claim_session(
            queues=["default"], worker_id="w", names=None, plan=OneDrawOf(4),
            settle=[(ids[1], None, 1)],
        )  # fmt: skip
        assert claimed == []
    finally:
        await store.close()
    assert sent == [
        ((), ["claim_one_queue"]),
        ((), ["complete_many", "claim_one_queue"]),
        ((), ["complete_many", "claim_one_queue"]),
    ]
    assert [task_row(pg_dsn, i)[0] for i in ids] == ["succeeded", "succeeded", "running"]
    assert task_row(pg_dsn, ids[2])[:3] == ("running", 1, "w")


async def test_a_claim_of_queues_no_limit_covers_is_the_unlimited_claim(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A limit on another queue leaves this claim as it is without limits: the
    protocol's statement, alone; before, every claim took the limited draw, a statement
    at a time, and a stream's pickup went from 1.4 to 9 ms at p50 (100 ms at p99)."""
    sent: list[list[str]] = []
    fly = cairnqd.store.postgres.store.claim_in_one_flight

    async def observed(conn: Any, begin: Any, steps: Any, *args: Any) -> Any:
        sent.append([stmt.name for stmt, _ in steps])
        return await fly(conn, begin, steps, *args)

    monkeypatch.setattr(cairnqd.store.postgres.store, "claim_in_one_flight", observed)
    async with CairnQ(PostgresStore(pg_dsn)) as direct:
        ids = [(await direct.submit("demo.echo", {})).id for _ in range(2)]
    store = PostgresStore(pg_dsn, listen=False)
    store.use_limits(parse_limits({"smtp": {"queues": ["email"], "concurrency": 1}}))
    await store.connect()
    try:
        assert [t.id for t in await store.claim(queues=["default"], worker_id="w")] == ids[:1]
        store.claim_recovery_every_s = 3600
        assert [t.id for t in await store.claim(queues=["default"], worker_id="w")] == ids[1:]
    finally:
        await store.close()
    assert sent == [["claim_one_queue"]]
    assert store.limited_for(["default"]) is None
    assert store.limited_for(["default", "email"]) is store.limited


class OneDrawOf:
    """A claim plan of one draw of up to `n` tasks of any name, that says so."""

    def __init__(self, n: int) -> None:
        self.draw = OneDraw(None, n)

    async def __call__(self, draw: ClaimDraw) -> list[Row]:
        return await draw(None, self.draw.limit)

    def one_draw(self) -> OneDraw:
        return self.draw


def slots_held(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "select task_id, attempt from cairnqd_limit_slots"
            " where limit_name = 'one' and until_ms > 0 order by slot"
        ).fetchall()
        return [tuple(row) for row in rows]


@pytest.fixture
async def limited(
    pg_proxy: FaultProxy, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[PostgresStore, list[str]]]:
    """A store through the proxy under `concurrency: 1` on queue email, holding the
    first of two tasks: the budget's rows made, its overrides read (and kept for a
    minute), recovery done, so its next claim with a settlement can go in one flight."""
    monkeypatch.setattr(cairnqd.store.limits, "OVERRIDES_EVERY_S", 60.0)
    async with CairnQ(PostgresStore(pg_dsn)) as direct:
        ids = [(await direct.submit("demo.echo", {}, queue="email")).id for _ in range(2)]
    store = PostgresStore(pg_proxy.dsn(pg_dsn), listen=False)
    store.use_limits(parse_limits({"one": {"queues": ["email"], "concurrency": 1}}))
    await store.connect()
    try:
        claimed = await store.claim(queues=["email"], worker_id="w-limited", limit=4)
        assert [t.id for t in claimed] == ids[:1]
        store.claim_recovery_every_s = 3600
        yield store, ids
    finally:
        pg_proxy.forward()
        await store.close()


@pytest.mark.timing
async def test_a_limited_hand_over_settles_and_claims_in_one_flight(
    limited: tuple[PostgresStore, list[str]],
    pg_proxy: FaultProxy,
    pg_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The slot of a task that settles goes to the next task in one round trip:
    results, the room given back and the claim of the next, together."""
    store, (first, second) = limited
    # The budget is full after this claim; its stale room was looked for by the first
    # claim, and is not looked for again (in a transaction of its own) for a minute.
    monkeypatch.setattr(cairnqd.store.limits, "RECLAIM_EVERY_S", 60.0)
    pg_proxy.delay(DELAY_S)
    started = time.monotonic()
    claimed = await store.claim_session(
        queues=["email"], worker_id="w-limited", names=None, plan=OneDrawOf(4),
        settle=[(first, None, 1)],
    )  # fmt: skip
    took = time.monotonic() - started
    assert claimed is not None and [t.id for t in claimed] == [second]
    # One statement at a time it is at least five round trips (BEGIN, complete_many,
    # the room's release, the claim, COMMIT): over 3 s through this proxy.
    assert took < 4 * DELAY_S, f"the hand-over took {took:.2f} s"
    assert task_row(pg_dsn, first)[0] == "succeeded"
    assert task_row(pg_dsn, second)[:3] == ("running", 1, "w-limited")
    assert slots_held(pg_dsn) == [(second, 1)]


async def test_a_limited_flight_cancelled_after_it_left_gives_task_and_room_back(
    limited: tuple[PostgresStore, list[str]], pg_proxy: FaultProxy, pg_dsn: str
) -> None:
    store, (first, second) = limited
    pg_proxy.delay(DELAY_S)
    claiming = asyncio.ensure_future(
        store.claim_session(
            queues=["email"],
            worker_id="w-limited",
            names=None,
            plan=OneDrawOf(4),
            settle=[(first, None, 1)],
        )
    )
    await wait_for_async("the flight's commit", lambda: task_row(pg_dsn, second)[0] == "running")
    assert not claiming.done()
    claiming.cancel()
    with pytest.raises(asyncio.CancelledError):
        await claiming
    assert task_row(pg_dsn, first)[0] == "succeeded"
    assert task_row(pg_dsn, second) == ("queued", 0, None, None)
    # The slot still names the handed-back claim, which no longer runs: the next claim
    # that finds the budget full frees it and takes the task.
    pg_proxy.forward()
    again = await store.claim(queues=["email"], worker_id="w-other", limit=4)
    assert [t.id for t in again] == [second]
    assert slots_held(pg_dsn) == [(second, 1)]
