"""cairnqd's `prefetch`: claim ahead of free slots, run everything, never more than
`concurrency` calls at once, and finish prefetched tasks when stopped. `auto` (the
default) claims ahead only for handlers that have shown they are fast."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.waiting import wait_for_async
from tests.support.worker import ErrorLog, running, wait_all

pytestmark = pytest.mark.timeout(60)


def test_prefetch_must_be_auto_or_a_non_negative_int(store: TaskStore) -> None:
    for bad in (-1, 1.5, True, "AUTO", None):
        with pytest.raises(ValueError, match="prefetch must be"):
            Worker(store, ["default"], prefetch=bad)  # type: ignore[arg-type]
    assert Worker(store, ["default"]).prefetch == "auto"
    assert Worker(store, ["default"], prefetch=0).prefetch == 0


async def test_prefetch_claims_ahead_but_runs_at_most_concurrency(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = Worker(
        store, ["default"], concurrency=2, prefetch=20, poll_interval_ms=50, on_error=errors
    )
    in_flight = 0
    peak = 0

    @worker.task("job")
    async def job(ctx: Any, payload: Any) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return int(payload["i"])

    tasks = await client.submit_many([{"name": "job", "payload": {"i": i}} for i in range(40)])
    async with running(worker):

        async def leased() -> int:
            return len(await client.list(status="running", limit=100))

        # More tasks hold a lease than run at once: the backlog is real.
        await wait_for_async("tasks claimed ahead of free slots", leased, accept=lambda n: n > 2)
        done = await wait_all(store, [t.id for t in tasks], "succeeded")
    assert [t.result for t in done] == list(range(40))
    assert peak <= 2
    assert not errors.calls


async def test_stop_runs_prefetched_tasks_instead_of_stranding_them(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = Worker(
        store, ["default"], concurrency=1, prefetch=10, poll_interval_ms=50, on_error=errors
    )
    gate = asyncio.Event()

    @worker.task("slow")
    async def slow(ctx: Any, payload: Any) -> None:
        await gate.wait()

    tasks = await client.submit_many([{"name": "slow"} for _ in range(6)])
    async with running(worker):

        async def leased() -> int:
            return len(await client.list(status="running", limit=100))

        await wait_for_async(
            "all six claimed (one running, five prefetched)", leased, accept=lambda n: n == 6
        )
        worker.stop()
        gate.set()
    done = await wait_all(store, [t.id for t in tasks], "succeeded")
    assert all(t.attempt == 1 for t in done)
    assert not errors.calls


async def test_auto_never_claims_ahead_for_slow_handlers(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = Worker(store, ["default"], concurrency=2, poll_interval_ms=50, on_error=errors)
    peak_running = 0

    @worker.task("slow")
    async def slow(ctx: Any) -> None:
        nonlocal peak_running
        rows = await client.list(status="running", limit=100)
        peak_running = max(peak_running, len(rows))
        await asyncio.sleep(0.2)

    tasks = await client.submit_many([{"name": "slow"} for _ in range(6)])
    async with running(worker):
        await wait_all(store, [t.id for t in tasks], "succeeded")
    # 200 ms calls at 2 slots start 10 per second: nothing fits a 50 ms horizon.
    assert peak_running == 2
    assert not errors.calls


async def test_auto_claims_ahead_once_handlers_prove_fast(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = Worker(store, ["default"], concurrency=2, poll_interval_ms=50, on_error=errors)
    gate = asyncio.Event()

    @worker.task("quick")
    async def quick(ctx: Any) -> None:
        return None

    @worker.task("held")
    async def held(ctx: Any) -> None:
        await gate.wait()

    warmup = await client.submit_many([{"name": "quick"} for _ in range(20)])
    async with running(worker):
        await wait_all(store, [t.id for t in warmup], "succeeded")
        tasks = await client.submit_many([{"name": "held"} for _ in range(30)])

        async def leased() -> int:
            return len(await client.list(status="running", limit=100))

        # Microsecond calls: the next claim takes far more than the 2 free slots.
        await wait_for_async("auto prefetch claiming ahead", leased, accept=lambda n: n > 2)
        gate.set()
        await wait_all(store, [t.id for t in tasks], "succeeded")
    assert not errors.calls


async def test_claim_budget_caps_claims_prefetch_included(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    """The daemon's max_tasks_per_child: a retiring worker claims no more than its
    budget, even when auto prefetch would take far more, and stops by itself."""
    worker = Worker(
        store, ["default"], concurrency=2, prefetch=50, poll_interval_ms=50, on_error=errors
    )
    worker.claim_budget = 7

    @worker.task
    async def quick(ctx: Any) -> None:
        return None

    tasks = await client.submit_many([{"name": "quick"} for _ in range(30)])
    await asyncio.wait_for(worker.run(), timeout=30)
    finished = [t for t in [await client.get(t.id) for t in tasks] if t and t.status != "queued"]
    assert len(finished) == 7
    assert all(t.status == "succeeded" for t in finished)
    assert worker.handled == 7
    assert not errors.calls


async def test_before_claim_false_stops_claiming(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = Worker(store, ["default"], concurrency=1, prefetch=0, on_error=errors)
    worker.before_claim = lambda: worker.handled < 3

    @worker.task
    async def quick(ctx: Any) -> None:
        return None

    tasks = await client.submit_many([{"name": "quick"} for _ in range(10)])
    await asyncio.wait_for(worker.run(), timeout=30)
    statuses = [t.status for t in [await client.get(t.id) for t in tasks] if t]
    assert statuses.count("succeeded") == 3 and statuses.count("queued") == 7
    assert not errors.calls


def _slow_pause_reads(worker: Worker, store: TaskStore) -> None:
    """Read the pause table before every claim, and take 20 ms over it: the calls a
    pass started always finish while its claim loop awaits the read."""
    pauses = worker._loop.pauses
    assert pauses is not None
    pauses.refresh_s = 0.0
    read = store.pauses.all

    async def slow_read() -> Any:
        await asyncio.sleep(0.02)
        return await read()

    store.pauses.all = slow_read  # type: ignore[method-assign]


async def test_held_tasks_start_at_once_when_the_queue_runs_dry(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    """A claim loop that honours pauses (every daemon child's) awaits the pause read
    between starting held tasks and claiming. Calls that ended during that await used
    to have their wake-up wiped before the claim, so once the queue ran dry (the claim
    came back empty) the worker waited out its poll interval with free slots and a
    backlog in hand: a daemon child on Postgres lost ~0.5 s at the end of every drain.
    Here the poll interval (30 s) is far longer than the whole run may take."""
    worker = Worker(
        store, ["default"], concurrency=8, poll_interval_ms=30_000, honour_pauses=True,
        on_error=errors,
    )  # fmt: skip
    _slow_pause_reads(worker, store)

    @worker.task("job")
    async def job(ctx: Any, payload: Any) -> None:
        return None

    done = await client.submit_many([{"name": "job"} for _ in range(2000)])
    async with running(worker):
        finished = await wait_all(store, [t.id for t in done], "succeeded", within=15.0)
    assert len(finished) == 2000
    assert not errors.calls


async def test_stop_during_a_pause_read_ends_the_run_at_once(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    """stop() sets the same wake-up: called while the loop awaited the pause read, it
    was wiped too, and run() waited out the poll interval before it returned."""
    worker = Worker(
        store, ["default"], concurrency=2, poll_interval_ms=30_000, honour_pauses=True,
        on_error=errors,
    )  # fmt: skip
    _slow_pause_reads(worker, store)
    read = store.pauses.all
    stop_now = asyncio.Event()
    stopped_in_read = asyncio.Event()

    async def read_then_stop() -> Any:
        if stop_now.is_set():
            worker.stop()  # the loop is inside this read: the stop lands mid-await
            stopped_in_read.set()
        return await read()

    store.pauses.all = read_then_stop  # type: ignore[method-assign]

    @worker.task("job")
    async def job(ctx: Any, payload: Any) -> None:
        return None

    task = await client.submit("job")
    runner = asyncio.create_task(worker.run())
    try:
        await wait_all(store, [task.id], "succeeded")
        stop_now.set()

        async def stop_landed() -> bool:
            # Wakes the loop (a commit; on Postgres a notification for the queue) for a
            # pass whose pause read the stop lands in, and whose claim finds nothing it
            # handles. A pass already past its read when the flag was set can take that
            # wake-up and find nothing to do: then the next submit wakes it again.
            if not stopped_in_read.is_set():
                await client.submit("not.handled.here")
            return stopped_in_read.is_set()

        await wait_for_async("a pass whose pause read the stop lands in", stop_landed)
        # From the stop on, nothing wakes the loop: run() must return by itself.
        await asyncio.wait_for(asyncio.shield(runner), 5.0)
    finally:
        worker.stop()
        await runner
    assert not errors.calls


@pytest.mark.timing
async def test_a_quiet_worker_waits_instead_of_spinning(store: TaskStore, client: CairnQ) -> None:
    """A worker told to stop claiming (a daemon child quieted by SIGTSTP, or whose SQLite
    file was replaced) never clears its wake-up, as only a claim did: every wait
    returned at once and it spun at a full core."""
    worker = Worker(store, ["default"], concurrency=2, poll_interval_ms=1000)

    @worker.task("job")
    async def job(ctx: Any, payload: Any) -> None:
        return None

    task = await client.submit("job")
    async with running(worker):
        await wait_all(store, [task.id], "succeeded")
        worker.claiming = False
        await asyncio.sleep(0.2)
        began_cpu, began = time.process_time(), time.monotonic()
        await asyncio.sleep(1.5)
        share = (time.process_time() - began_cpu) / (time.monotonic() - began)
    assert share < 0.3, f"a quiet worker used {share:.0%} of a core"


async def test_results_of_a_prefetching_worker_commit_as_the_store_allows(
    store: TaskStore, client: CairnQ, errors: ErrorLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a transaction has round trips in it (Postgres), the results a claim that
    reaches ahead would carry are committed first, on their own; where it runs straight
    to its commit (SQLite), they ride in the claim: one commit per cycle."""
    carried: list[int] = []  # results in each claim that reached ahead
    alone: list[int] = []  # results committed on their own

    claim_session, complete_many = store.claim_session, store.complete_many

    async def recorded_claim(**kwargs: Any) -> Any:
        if kwargs["plan"].ahead > 0:
            carried.append(len(kwargs.get("settle", ())))
        return await claim_session(**kwargs)

    async def recorded_complete(**kwargs: Any) -> Any:
        alone.append(len(kwargs["items"]))
        return await complete_many(**kwargs)

    monkeypatch.setattr(store, "claim_session", recorded_claim)
    monkeypatch.setattr(store, "complete_many", recorded_complete)
    worker = Worker(
        store, ["default"], concurrency=2, prefetch=20, poll_interval_ms=50, on_error=errors
    )

    @worker.task("job")
    async def job(ctx: Any, payload: Any) -> int:
        await asyncio.sleep(0.002)
        return int(payload["i"])

    tasks = await client.submit_many([{"name": "job", "payload": {"i": i}} for i in range(120)])
    async with running(worker):
        done = await wait_all(store, [t.id for t in tasks], "succeeded")
    assert [t.result for t in done] == list(range(120))
    assert not errors.calls
    assert len(carried) > 2, "the worker never claimed ahead"
    if store.dialect == "sqlite":
        assert any(carried), "no claim that reached ahead carried the results before it"
    else:
        assert not any(carried), f"claims that reached ahead carried results: {carried}"
        assert alone, "no results were committed on their own"
