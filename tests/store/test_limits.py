"""Flow-control limits at the store: a limited claim starts a task only with room in
every budget it needs, two claims never share the last slot, room comes back however
a claim ends, and a full budget never holds up the work behind it. Both dialects,
real databases, several stores (each its own connection, as two hosts would have).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from cairnqd.context import TaskContext
from cairnqd.limits import Limit, Rate, parse_limits
from cairnqd.models import Task
from cairnqd.store.base import TaskStore
from cairnqd.store.limits import RECLAIM_EVERY_S
from cairnqd.worker import Worker
from tests.support.databases import make_store
from tests.support.undecodable import SQLITE_BAD, insert_bad
from tests.support.waiting import wait_for_async

SMTP = parse_limits({"smtp": {"queues": ["email"], "concurrency": 2}})
SERIAL = parse_limits({"one": {"queues": ["email"], "concurrency": 1}})


@pytest.fixture
async def stores(dialect: str, db_target: str) -> AsyncIterator[list[TaskStore]]:
    """Two stores on one database, as two hosts would be."""
    made = [make_store(dialect, db_target) for _ in range(2)]
    for store in made:
        await store.connect()
    try:
        yield made
    finally:
        for store in made:
            await store.close()


async def claim(
    store: TaskStore, worker: str, n: int = 10, queues: Sequence[str] = ("email",)
) -> list[Task]:
    return await store.claim(queues=list(queues), worker_id=worker, limit=n, lease_ms=60_000)


async def submit(
    store: TaskStore, n: int, queue: str = "email", name: str = "send", **kw: Any
) -> list[Task]:
    return [await store.submit(name=name, queue=queue, **kw) for _ in range(n)]


async def test_concurrency_is_shared_between_stores(stores: list[TaskStore]) -> None:
    a, b = stores
    for store in stores:
        store.use_limits(SMTP)
    await submit(a, 5)
    first = await claim(a, "wa")
    second = await claim(b, "wb")
    assert (len(first), len(second)) == (2, 0)
    # One settles: its room goes to whichever claims next.
    await a.complete(task_id=first[0].id, worker_id="wa", result=None)
    assert len(await claim(b, "wb")) == 1
    assert await claim(a, "wa") == []


async def test_a_claim_by_a_worker_without_the_limit_shows_as_outside_it(
    stores: list[TaskStore],
) -> None:
    a, b = stores
    a.use_limits(SMTP)
    await submit(a, 3)
    (_mine,) = await claim(a, "wa", n=1)
    (theirs,) = await claim(b, "sdk", n=1)  # no limits: the protocol's claim statement
    found = await a.limit_table.bypassing(SMTP)
    assert [(x.limit, x.task_id, x.worker_id) for x in found] == [("smtp", theirs.id, "sdk")]
    assert "runs outside it, claimed by worker sdk" in found[0].describe()
    (usage,) = await a.limit_table.usage(SMTP)
    # SQLite counts every covered task that runs against the limit, theirs too;
    # Postgres counts the slots its claims took.
    in_use = 2 if a.dialect == "sqlite" else 1
    assert (usage.in_use, usage.waiting) == (in_use, 1)
    if a.dialect == "sqlite":
        assert await claim(a, "wa", n=1) == []  # no room left: theirs holds the second
    # A daemon notes it (maintenance, every few seconds): the warning outlives the task.
    assert await a.limit_table.note_bypasses(SMTP) == 1
    await b.complete(task_id=theirs.id, worker_id="sdk", result=None)
    assert await a.limit_table.bypassing(SMTP, running_only=True) == []
    (seen,) = await a.limit_table.bypassing(SMTP)
    assert (seen.task_id, seen.worker_id, seen.running) == (theirs.id, "sdk", False)
    assert "ran outside it (seen " in seen.describe()
    # Forgotten an hour after it was last seen.
    await a.limit_table.forget_bypasses_before(int(time.time() * 1000) + 1)
    assert await a.limit_table.bypassing(SMTP) == []


async def test_a_failure_and_a_recovered_lease_give_the_room_back(stores: list[TaskStore]) -> None:
    a, b = stores
    for store in stores:
        store.use_limits(parse_limits({"one": {"queues": ["email"], "concurrency": 1}}))
    await submit(a, 3)
    (held,) = await claim(a, "wa")
    await a.fail(task_id=held.id, worker_id="wa", error={"message": "boom"}, retryable=True)
    (again,) = await claim(b, "wb")
    # A lease that runs out frees the room for the claim that recovers it, once the
    # store looks for stale room again (at most every RECLAIM_EVERY_S).
    await b.heartbeat(task_id=again.id, worker_id="wb", lease_ms=1)
    await asyncio.sleep(RECLAIM_EVERY_S + 0.05)
    retaken = await claim(a, "wa")
    assert len(retaken) == 1


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
async def test_sqlite_counts_what_runs_and_writes_no_concurrency_slot(
    stores: list[TaskStore], db_target: str
) -> None:
    a, _ = stores
    a.use_limits(SMTP)
    await submit(a, 4)
    mine = await claim(a, "wa")
    assert len(mine) == 2
    await a.complete(task_id=mine[0].id, worker_id="wa", result=None)
    (again,) = await claim(a, "wa")  # its room is back with the settle: nothing to free
    with contextlib.closing(sqlite3.connect(db_target)) as conn:
        assert conn.execute("select count(*) from cairnqd_limit_slots").fetchone() == (0,)
        noted = conn.execute("select limit_name, worker_id from cairnqd_limit_workers")
        assert noted.fetchall() == [("smtp", "wa")]
    # A lease that ran out is room again the moment it is recovered, at no reclaim's pace.
    await a.heartbeat(task_id=again.id, worker_id="wa", lease_ms=1)
    await wait_for_async("the lease to be recovered", a.recover_leases)
    assert len(await claim(a, "wa")) == 1  # 2 allowed, 1 running


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
async def test_sqlite_notes_a_worker_again_when_its_claim_is_rolled_back(
    stores: list[TaskStore], db_target: str
) -> None:
    """A row another client wrote that is not UTF-8 rolls the claim's first try back
    (the replay then reads it as markers): the note of the worker written in that try
    goes with it, so the replay must write it again, or the worker's own claims would
    be reported as passing the limit by."""
    a, _ = stores
    limits = parse_limits({"smtp": {"queues": ["default"], "concurrency": 2}})
    a.use_limits(limits)
    insert_bad("sqlite", db_target, SQLITE_BAD["payload-not-utf8"])
    await a.submit(name="send", queue="default")
    claimed = await claim(a, "wa", queues=["default"])
    assert len(claimed) == 1  # the good task; the bad row is failed, not run
    with contextlib.closing(sqlite3.connect(db_target)) as conn:
        noted = conn.execute("select limit_name, worker_id from cairnqd_limit_workers")
        assert noted.fetchall() == [("smtp", "wa")]
    assert await a.limit_table.bypassing(limits) == []


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
async def test_sqlite_forgets_a_worker_once_it_neither_claims_nor_runs(
    stores: list[TaskStore], db_target: str
) -> None:
    a, _ = stores
    a.use_limits(SMTP)
    await submit(a, 1)
    (mine,) = await claim(a, "wa")
    with contextlib.closing(sqlite3.connect(db_target)) as conn, conn:
        conn.execute("insert into cairnqd_limit_workers values ('smtp', 'gone', 0)")
        conn.execute("update cairnqd_limit_workers set seen_at_ms = 0")
    await a.limit_table.forget_bypasses_before(0)
    # Both were last seen long ago; "wa" still runs a task, so its note stays.
    assert await a.limit_table.bypassing(SMTP) == []
    with contextlib.closing(sqlite3.connect(db_target)) as conn:
        rows = conn.execute("select worker_id from cairnqd_limit_workers").fetchall()
    assert rows == [("wa",)]
    await a.complete(task_id=mine.id, worker_id="wa", result=None)
    await a.limit_table.forget_bypasses_before(0)
    with contextlib.closing(sqlite3.connect(db_target)) as conn:
        assert conn.execute("select count(*) from cairnqd_limit_workers").fetchone() == (0,)


async def test_unlimited_queues_and_names_are_untouched(stores: list[TaskStore]) -> None:
    (a, _) = stores
    a.use_limits(parse_limits({"mail": {"names": ["mail.*"], "concurrency": 1}}))
    await submit(a, 3, name="mail.welcome", priority=10)
    await submit(a, 3, name="report")
    got = await claim(a, "wa")
    # The one mail task with room, then the work behind the full budget.
    assert sorted(t.name for t in got) == ["mail.welcome", "report", "report", "report"]


async def test_a_full_budget_is_stepped_over_deep_in_the_queue(stores: list[TaskStore]) -> None:
    (a, _) = stores
    a.use_limits(parse_limits({"slow": {"names": ["slow"], "concurrency": 1}}))
    # Far more blocked tasks ahead than one pass of the draw reads.
    await a.submit_many([{"name": "slow", "queue": "email", "priority": 5}] * 1500)
    await submit(a, 2, name="quick")
    got = await claim(a, "wa", n=3)
    assert sorted(t.name for t in got) == ["quick", "quick", "slow"]


async def test_partitions_have_budgets_of_their_own(stores: list[TaskStore]) -> None:
    a, b = stores
    spec = {"tenant": {"queues": ["email"], "concurrency": 1, "partition_by": "payload.tenant"}}
    for store in stores:
        store.use_limits(parse_limits(spec))
    for tenant in ["acme", "acme", "globex", "globex"]:
        await a.submit(name="send", queue="email", payload={"tenant": tenant})
    await a.submit(name="send", queue="email", payload={"other": 1})
    await a.submit(name="send", queue="email", payload=[1, 2])
    got = await claim(a, "wa") + await claim(b, "wb")
    tenants = sorted(
        str((t.payload or {}).get("tenant")) if isinstance(t.payload, dict) else "list" for t in got
    )
    # One per tenant; the two without the field share the "(none)" budget.
    assert len(got) == 3
    assert tenants.count("acme") == 1 and tenants.count("globex") == 1


async def test_a_task_needs_room_in_every_limit_that_covers_it(stores: list[TaskStore]) -> None:
    (a, _) = stores
    a.use_limits(
        parse_limits(
            {
                "queue_wide": {"queues": ["email"], "concurrency": 3},
                "welcome": {"names": ["welcome"], "concurrency": 1},
            }
        )
    )
    await submit(a, 3, name="welcome", priority=1)
    await submit(a, 3, name="digest")
    got = await claim(a, "wa")
    assert sorted(t.name for t in got) == ["digest", "digest", "welcome"]


async def test_a_rate_counts_starts_in_a_sliding_window(stores: list[TaskStore]) -> None:
    a, b = stores
    for store in stores:
        store.use_limits(parse_limits({"api": {"queues": ["email"], "rate": "3/600ms"}}))
    await submit(a, 8)
    got = await claim(a, "wa")
    for task in got:
        await a.complete(task_id=task.id, worker_id="wa", result=None)
    # Settling gives no rate back: the starts stay in the window.
    assert len(got) == 3 and await claim(b, "wb") == []
    waited = b.room_wait_ms(time.monotonic())
    assert waited is not None and 0 < waited <= 600
    await asyncio.sleep(0.7)
    assert len(await claim(b, "wb")) == 3


async def test_lowering_a_limit_starts_nothing_until_below_it(stores: list[TaskStore]) -> None:
    (a, _) = stores
    a.use_limits([Limit("c", queues=("email",), concurrency=3)])
    await submit(a, 6)
    running = await claim(a, "wa")
    assert len(running) == 3
    a.use_limits([Limit("c", queues=("email",), concurrency=1)])
    for task in running[:2]:
        await a.complete(task_id=task.id, worker_id="wa", result=None)
        assert await claim(a, "wa") == []  # still at or above the new limit
    await a.complete(task_id=running[2].id, worker_id="wa", result=None)
    assert len(await claim(a, "wa")) == 1
    assert await claim(a, "wa") == []


async def test_two_claims_racing_for_the_last_slot(stores: list[TaskStore]) -> None:
    """One claim holds its transaction open after taking the last slot; the other
    claims meanwhile (Postgres) or right after it commits (SQLite: it waits on the
    write lock), and must get nothing of the limited queue either way."""
    a, b = stores
    one = [Limit("one", queues=("email",), concurrency=1)]
    for store in stores:
        store.use_limits(one)
    # Each store has met the budget once, so its slot exists and is known: the rival
    # then meets the slot itself (locked by the holder), not a slot still being made.
    for store, worker in ((a, "wa"), (b, "wb")):
        await submit(a, 1)
        (warm,) = await claim(store, worker)
        await store.complete(task_id=warm.id, worker_id=worker, result=None)
    await submit(a, 3)
    drawn = asyncio.Event()
    release = asyncio.Event()

    async def slow_plan(draw: Any) -> Any:
        rows = await draw(None, 5)
        drawn.set()
        await release.wait()
        return rows

    holder = asyncio.create_task(
        a.claim_session(queues=["email"], worker_id="wa", names=None, plan=slow_plan)
    )
    await asyncio.wait_for(drawn.wait(), 10)
    rival = asyncio.create_task(claim(b, "wb"))
    await asyncio.sleep(0.3)  # let the rival run its claim (or queue on the lock)
    release.set()
    held = await asyncio.wait_for(holder, 10)
    assert held is not None and len(held) == 1
    assert await asyncio.wait_for(rival, 20) == []


def test_rates_and_limits_parse_with_the_key_named() -> None:
    assert parse_limits({"x": {"queues": ["q"], "rate": "100/10s"}})[0].rate == Rate(100, 10_000)
    bad = [
        ({"X": {"queues": ["q"], "concurrency": 1}}, "name must match"),
        ({"x": {"concurrency": 1}}, "limits.x must say which tasks"),
        ({"x": {"queues": ["q"]}}, "limits.x must set concurrency, rate, or both"),
        ({"x": {"queues": ["q"], "concurrency": 0}}, "limits.x.concurrency must be between"),
        ({"x": {"queues": ["q"], "rate": "100 per s"}}, "limits.x.rate must be COUNT/DURATION"),
        ({"x": {"queues": ["q"], "rate": "5/1fortnight"}}, "limits.x.rate"),
        # A slot is held until its start plus the window: past 100 years, past the store.
        ({"x": {"queues": ["q"], "rate": "1/36501d"}}, "the window must be at most 36500d"),
        ({"x": {"names": ["a[b]"], "concurrency": 1}}, r"limits.x.names\[0\]"),
        ({"x": {"queues": ["q"], "concurrency": 1, "partition_by": "payload.a b"}}, "partition_by"),
        ({"x": {"queues": ["q"], "concurrency": 1, "per": 1}}, "unknown key 'per'"),
    ]
    for spec, said in bad:
        with pytest.raises(ValueError, match=said):
            parse_limits(spec)


async def test_many_claimers_at_once_never_pass_the_limit(dialect: str, db_target: str) -> None:
    """Four stores (four hosts' workers) claim and settle as fast as they can; after every
    claim, the tasks running under the limit are counted in the database."""
    stores = [make_store(dialect, db_target) for _ in range(4)]
    for store in stores:
        await store.connect()
        store.use_limits([Limit("three", queues=("email",), concurrency=3)])
    try:
        await stores[0].submit_many([{"name": "send", "queue": "email"}] * 120)
        seen: list[int] = []

        async def work(store: TaskStore, worker: str) -> None:
            for _ in range(40):
                got = await claim(store, worker, n=2)
                if got:
                    running = await store.list(status="running", queue="email", limit=500)
                    seen.append(len(running))
                    await asyncio.sleep(0.005)
                for task in got:
                    await store.complete(task_id=task.id, worker_id=worker, result=None)
                if not got:
                    await asyncio.sleep(0.005)

        await asyncio.gather(*(work(s, f"w{i}") for i, s in enumerate(stores)))
        assert seen and max(seen) <= 3
        assert max(seen) == 3  # the budget was used in full at some point
    finally:
        for store in stores:
            await store.close()


async def test_a_limited_task_is_claimed_only_for_a_free_slot(stores: list[TaskStore]) -> None:
    """Prefetch: of a claim for 6 with 2 free slots, at most 2 are rate-limited tasks;
    the unlimited work behind them fills the rest."""
    (a, _) = stores
    a.use_limits(parse_limits({"paced": {"queues": ["email"], "rate": "50/1s"}}))
    await a.submit_many([{"name": "send", "queue": "email", "priority": 5}] * 6)
    await a.submit_many([{"name": "report", "queue": "other"}] * 6)

    async def plan(draw: Any) -> Any:
        return await draw(None, 6, 2)

    got = await a.claim_session(queues=["email", "other"], worker_id="wa", names=None, plan=plan)
    assert got is not None
    assert sorted(t.queue for t in got) == ["email", "email", "other", "other", "other", "other"]


async def test_a_worker_waiting_for_room_claims_once_per_task(dialect: str, db_target: str) -> None:
    """A worker with free slots under `concurrency: 1`: the result of each task rides
    in the claim that starts the next (that claim gives the room back and takes it
    again), and while the one task runs the worker claims nothing: a claim then could
    only find the limit full."""
    store = make_store(dialect, db_target)
    await store.connect()
    try:
        await store.submit_many([{"name": "send", "queue": "email"}] * 12)
        worker = Worker(store, ["email"], concurrency=4, limits=SERIAL)
        starts: list[float] = []
        all_started = asyncio.Event()

        @worker.task("send")
        async def send(ctx: TaskContext) -> None:
            starts.append(time.monotonic())
            if len(starts) == 12:
                all_started.set()
            await asyncio.sleep(0.03)

        claims: list[tuple[int, int]] = []  # (results carried, tasks claimed)
        original = store.claim_session

        async def counted(**kw: Any) -> list[Task] | None:
            got = await original(**kw)
            claims.append((len(kw.get("settle", ())), len(got or [])))
            return got

        store.claim_session = counted  # type: ignore[method-assign]
        runner = asyncio.create_task(worker.run())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_started.wait(), 60)
        worker.stop()
        await runner
    finally:
        await store.close()
    assert len(starts) == 12
    taking = [c for c in claims if c[1]]
    assert all(took == 1 for _, took in taking)
    # Every task after the first started from a claim carrying the one before it.
    assert sum(1 for carried, took in taking if carried and took) >= 10, claims
    # Empty claims are the rare wake-ups from outside (a poll): never one per task.
    assert sum(1 for _, took in claims if not took) <= 4, claims
