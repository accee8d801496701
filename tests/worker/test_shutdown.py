"""docs/protocol.md §8.7, #serve-owns-signals, #drain-in-finally, #local-overrides,
#clamp-concurrency, #background-raises: stopping, draining, background() error
propagation, and serve()'s ownership of the process signals."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.errors import ProtocolVersionMismatch
from cairnqd.store.base import TaskStore
from cairnqd.store.sqlite import SQLiteStore
from cairnqd.worker import Worker
from tests.support.databases import make_store
from tests.support.store import query
from tests.support.worker import (
    SQLITE_ONLY,
    IdleProbe,
    caught_signals,
    eventually,
    reap,
    running,
    start_worker_process,
    wait_exit,
    wait_status,
    wrap_method,
)

pytestmark = pytest.mark.timeout(60)


# -- stop() and the drain ----------------------------------------------------------------


async def test_stop_drains_in_flight_calls(store: TaskStore, client: CairnQ) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50, concurrency=2, lease_ms=600)
    started = asyncio.Event()
    release = asyncio.Event()

    @worker.task
    async def slow(ctx: TaskContext) -> str:
        started.set()
        await release.wait()
        await asyncio.sleep(0.7)  # past a lease: heartbeats continue during the drain
        return "drained"

    task = await client.submit("slow")
    runner = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 20)
    worker.stop()
    # An observation window, not synchronization: run() must still be draining.
    await asyncio.sleep(0.3)
    assert not runner.done(), "run() returned with a call still in flight"
    late = await client.submit("slow")
    release.set()
    await asyncio.wait_for(runner, 20)
    done = await store.get(task.id)
    assert done is not None
    assert (done.status, done.result, done.attempt) == ("succeeded", "drained", 1)
    untouched = await store.get(late.id)
    assert untouched is not None and untouched.status == "queued", "claimed after stop()"


@pytest.mark.timing
async def test_stop_cuts_an_idle_sleep_short(store: TaskStore) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=5000)

    @worker.task
    async def unused(ctx: TaskContext) -> None: ...

    probe = IdleProbe(store)
    runner = asyncio.create_task(worker.run())
    await eventually(probe.idle.is_set, what="the worker to idle on its 5 s poll")
    t0 = time.monotonic()
    worker.stop()
    await asyncio.wait_for(runner, 20)
    assert time.monotonic() - t0 < 1.0


@pytest.mark.timing
@SQLITE_ONLY
async def test_stop_during_a_claim_is_prompt(store: TaskStore) -> None:
    """stop() landing while a claim is in flight must not wait out the poll interval."""
    worker = Worker(store, ["default"], poll_interval_ms=2000)

    @worker.task
    async def unused(ctx: TaskContext) -> None: ...

    stopped_at: list[float] = []

    async def claim_session(original: Any, *args: Any, **kwargs: Any) -> Any:
        result = await original(*args, **kwargs)
        if not stopped_at:
            worker.stop()
            stopped_at.append(time.monotonic())
        return result

    wrap_method(store, "claim_session", claim_session)
    runner = asyncio.create_task(worker.run())
    await asyncio.wait_for(asyncio.shield(runner), 20)
    assert time.monotonic() - stopped_at[0] < 1.0


@SQLITE_ONLY
async def test_run_concurrency_override_is_not_sticky_and_is_clamped(
    store: TaskStore, client: CairnQ
) -> None:
    """docs/protocol.md#local-overrides, #clamp-concurrency (a fresh worker per run:
    upstream's stop() is permanent)."""
    in_flight = 0
    peak = 0
    gate = asyncio.Event()

    def make() -> Worker:
        worker = Worker(store, ["default"], poll_interval_ms=20, concurrency=1)

        @worker.task
        async def job(ctx: TaskContext) -> None:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await gate.wait()
            in_flight -= 1

        return worker

    worker = make()
    ids = [t.id for t in await client.submit_many([{"name": "job"}] * 3)]
    async with running(worker, concurrency=3):
        await eventually(lambda: in_flight == 3, what="three concurrent calls")
        gate.set()
        for i in ids:
            await wait_status(store, i)
    assert peak == 3
    assert worker.concurrency == 1, "the override stuck to the worker"

    gate.clear()
    peak = 0
    ids = [t.id for t in await client.submit_many([{"name": "job"}] * 2)]
    async with running(make(), concurrency=0):
        await eventually(lambda: in_flight == 1, what="one call (0 clamps to 1)")
        gate.set()
        for i in ids:
            await wait_status(store, i)
    assert peak == 1


@SQLITE_ONLY
async def test_run_does_not_touch_process_signals(store: TaskStore, client: CairnQ) -> None:
    """docs/protocol.md#serve-owns-signals: only serve() owns SIGINT/SIGTERM."""
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))

    def make() -> Worker:
        worker = Worker(store, ["default"], poll_interval_ms=20)

        @worker.task
        async def ping(ctx: TaskContext) -> str:
            return "pong"

        return worker

    async with running(make()):
        assert await client.call("ping", timeout_ms=20_000) == "pong"
        during = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    async with make().background():
        assert await client.call("ping", timeout_ms=20_000) == "pong"
        during_bg = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    assert during == before
    assert during_bg == before


# -- background() --------------------------------------------------------------------------


@SQLITE_ONLY
async def test_background_runs_the_worker_for_the_block(store: TaskStore, client: CairnQ) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=20)

    @worker.task
    async def add(ctx: TaskContext, payload: Any) -> int:
        return int(payload["a"]) + int(payload["b"])

    async with worker.background() as same:
        assert same is worker
        assert await client.call("add", {"a": 2, "b": 3}, timeout_ms=20_000) == 5


@SQLITE_ONLY
async def test_background_with_an_immediate_body_returns(store: TaskStore) -> None:
    """stop() issued before run() got going must not be lost."""
    worker = Worker(store, ["default"], poll_interval_ms=5000)

    async def enter_and_leave() -> None:
        async with worker.background():
            pass

    await asyncio.wait_for(enter_and_leave(), 2)


async def test_background_reraises_a_run_failure_when_the_body_returns(tmp_path: Path) -> None:
    """docs/protocol.md#background-raises: a database that will not open is not a silent success."""
    directory = tmp_path / "a_directory"
    directory.mkdir()
    store = SQLiteStore(str(directory))
    worker = Worker(store, ["default"])
    body_ran = False
    with pytest.raises(sqlite3.OperationalError):
        async with worker.background():
            body_ran = True
            await asyncio.sleep(0.05)
    assert body_ran
    await store.close()


async def test_background_reraises_a_protocol_mismatch(dialect: str, db_target: str) -> None:
    setup = make_store(dialect, db_target)
    await setup.connect()
    await setup.close()
    query(dialect, db_target, "update cairnq_meta set value = '2' where key = 'protocol_version'")
    store = make_store(dialect, db_target)
    worker = Worker(store, ["default"])
    try:
        with pytest.raises(ProtocolVersionMismatch):
            async with worker.background():
                await asyncio.sleep(0.05)
    finally:
        await store.close()


async def test_background_body_error_wins_with_the_worker_error_as_cause(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "a_directory"
    directory.mkdir()
    store = SQLiteStore(str(directory))
    worker = Worker(store, ["default"])
    with pytest.raises(KeyError) as caught:
        async with worker.background():
            await asyncio.sleep(0.05)
            raise KeyError("from the body")
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    await store.close()


async def test_background_closes_a_store_it_owns(tmp_path: Path) -> None:
    db = str(tmp_path / "owned.db")
    worker = Worker.sqlite(db, poll_interval_ms=20)

    @worker.task
    async def ping(ctx: TaskContext) -> str:
        return "pong"

    async with worker.background():
        client = CairnQ(worker.store)
        await client.connect()
        assert await client.call("ping", timeout_ms=20_000) == "pong"
    # Closed: the file can be opened exclusively.
    with closing(sqlite3.connect(db, timeout=0)) as conn:
        conn.execute("begin exclusive")
        conn.execute("rollback")


# -- serve() in a real process -------------------------------------------------------------

SERVE_SCRIPT = """
worker = make_worker(poll_interval_ms=20, lease_ms=2000)

@worker.task
async def block(ctx, payload):
    mark("started")
    await wait_flag("release")
    return {"drained": True, "attempt": ctx.attempt}

worker.serve()
mark("serve-returned")
"""

SIGTERM_BIT = 1 << (signal.SIGTERM - 1)


async def test_serve_drains_on_sigterm_and_exits_zero(
    store: TaskStore, client: CairnQ, dialect: str, db_target: str, tmp_path: Path
) -> None:
    task = await client.submit("block")
    flags = tmp_path / "flags"
    proc = start_worker_process(
        SERVE_SCRIPT, dialect=dialect, target=db_target, flags=flags, tmp=tmp_path
    )
    try:
        await eventually(lambda: (flags / "started").exists() or proc.poll() is not None)
        assert proc.poll() is None, reap(proc)
        proc.send_signal(signal.SIGTERM)
        # The handlers stand down after the first signal ...
        await eventually(lambda: not caught_signals(proc.pid) & SIGTERM_BIT)
        # ... and the process keeps draining the in-flight call.
        await asyncio.sleep(0.3)
        assert proc.poll() is None, "serve() exited without draining"
        running_row = await store.get(task.id)
        assert running_row is not None and running_row.status == "running"
        (flags / "release").touch()
        code = await wait_exit(proc)
    finally:
        _, _, err = reap(proc)
    assert code == 0, err
    assert (flags / "serve-returned").exists()
    done = await store.get(task.id)
    assert done is not None
    assert (done.status, done.result) == ("succeeded", {"drained": True, "attempt": 1})


@SQLITE_ONLY
async def test_serve_second_sigint_goes_through(
    store: TaskStore, client: CairnQ, dialect: str, db_target: str, tmp_path: Path
) -> None:
    task = await client.submit("block")
    flags = tmp_path / "flags"
    proc = start_worker_process(
        SERVE_SCRIPT, dialect=dialect, target=db_target, flags=flags, tmp=tmp_path
    )
    try:
        await eventually(lambda: (flags / "started").exists() or proc.poll() is not None)
        assert proc.poll() is None, reap(proc)
        proc.send_signal(signal.SIGINT)
        # Wait until the first signal has been handled (the handlers are removed).
        await eventually(lambda: not caught_signals(proc.pid) & SIGTERM_BIT)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        code = await wait_exit(proc)
    finally:
        _, _, err = reap(proc)
    assert code in (-signal.SIGINT, 128 + signal.SIGINT), (code, err)
    assert "KeyboardInterrupt" in err
    assert not (flags / "serve-returned").exists()
    row = await store.get(task.id)
    assert row is not None and row.status == "running", "an interrupted task is not settled"


@pytest.mark.timing
@SQLITE_ONLY
async def test_serve_idle_stops_promptly_on_sigterm(
    store: TaskStore, client: CairnQ, dialect: str, db_target: str, tmp_path: Path
) -> None:
    """SIGTERM with nothing in flight: a prompt, clean exit."""
    flags = tmp_path / "flags"
    script = """
worker = make_worker(poll_interval_ms=5000)

@worker.task
async def unused(ctx):
    return None

worker.serve()
"""
    proc = start_worker_process(
        script, dialect=dialect, target=db_target, flags=flags, tmp=tmp_path
    )
    try:
        await eventually(lambda: caught_signals(proc.pid) & SIGTERM_BIT or proc.poll() is not None)
        assert proc.poll() is None, reap(proc)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = await wait_exit(proc)
        elapsed = time.monotonic() - t0
    finally:
        _, _, err = reap(proc)
    assert code == 0, err
    assert elapsed < 2.0, f"an idle serve() took {elapsed:.2f}s to stop"
