"""The SQLite file's disk fills up under a worker, then gets room again.

A full disk refuses every write ("database or disk is full", SQLITE_FULL) while the
request itself is fine: the same write succeeds once an operator frees space. So a
worker must treat it like a busy or unreachable database, never like a row the database
refuses. Before this was so, a result that could not be written was retried alone,
then recorded as the task's *permanent* failure (`unserializable_result`), and where
even that write failed the task was dropped with a warning per task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ, SQLiteStore, Worker
from cairnqd.context import TaskContext
from cairnqd.daemon.parent.status import FULL_RECENT_S
from tests.faults.small_disk import SmallDisk, small_disk
from tests.support.daemon import Daemon, base_config, healthz
from tests.support.harness import gauge, scrape, stats
from tests.support.waiting import wait_for, wait_for_async
from tests.support.worker import ErrorLog

__all__ = ["small_disk"]

pytestmark = pytest.mark.slow

TASKS = 8
SQLITE_FULL = 13


def _is_sqlite_full(exc: BaseException) -> bool:
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF == SQLITE_FULL


async def test_results_finished_while_the_disk_is_full_are_written_once_it_has_room(
    small_disk: SmallDisk,
) -> None:
    path = small_disk.path / "tasks.db"
    async with CairnQ.sqlite(str(path)) as client:
        submitted = await client.submit_many(
            [{"name": "f.held", "payload": {"i": i}} for i in range(TASKS)]
        )
    errors = ErrorLog()
    worker = Worker(
        SQLiteStore(str(path)),
        concurrency=TASKS,
        on_error=errors,
    )
    release = asyncio.Event()
    started: list[int] = []

    @worker.task("f.held")
    async def held(ctx: TaskContext, payload: dict[str, int]) -> dict[str, int]:
        started.append(payload["i"])
        await release.wait()
        return {"done": payload["i"]}

    runner = asyncio.create_task(worker.run())
    try:
        await wait_for_async("every task to start", lambda: len(started) == TASKS)
        small_disk.fill(path)
        release.set()
        await wait_for_async(
            "the results' write to fail for want of space",
            lambda: any(_is_sqlite_full(exc) for exc, _ in errors.calls),
        )
        small_disk.free()
        async with CairnQ.sqlite(str(path)) as client:

            async def statuses() -> list[str]:
                found = [await client.get(t.id) for t in submitted]
                return [t.status if t is not None else "missing" for t in found]

            await wait_for_async(
                "every task to succeed", statuses, accept=lambda s: s == ["succeeded"] * TASKS
            )
            done = [await client.get(t.id) for t in submitted]
        assert [t.result if t else None for t in done] == [{"done": i} for i in range(TASKS)]
        assert all(t is not None and t.attempt == 1 for t in done), "no task ran twice"
    finally:
        release.set()
        worker.stop()
        await asyncio.wait_for(runner, 30)


def _full_lines(daemon: Daemon) -> list[str]:
    return [line for line in daemon.output().splitlines() if "database or disk is full" in line]


def _full_errors_counted(port: int) -> float:
    return gauge(scrape(port), "cairnq_db_errors_total", component="child", kind="full") or 0.0


def test_the_daemon_rides_out_a_full_disk_and_says_so_without_a_flood(
    small_disk: SmallDisk, daemon_factory: Callable[[dict[str, Any]], Daemon], tmp_path: Path
) -> None:
    path = small_disk.path / "tasks.db"
    config = base_config(
        tmp_path,
        {"path": str(path)},
        {"default": {"queues": ["default"], "processes": 2, "concurrency": 4, "lease": "3s"}},
    )
    daemon = daemon_factory(config).start()
    wait_for("both children ready", lambda: len(daemon.children()) == 2, timeout=60)
    port = daemon.metrics_port()

    async def submit() -> list[str]:
        async with CairnQ.sqlite(str(path)) as client:
            items = [{"name": "t.sleep", "payload": {"seconds": 0.02}} for _ in range(600)]
            return [t.id for t in await client.submit_many(items)]

    ids = asyncio.run(submit())
    wait_for("work under way", lambda: stats("sqlite", str(path))["default"]["succeeded"] >= 20)
    small_disk.fill(path)
    wait_for("the children to count full-disk errors", lambda: _full_errors_counted(port) > 0)
    # A few seconds of every heartbeat, result write and claim failing (claims hold
    # while results cannot be written: one tries the disk every few seconds).
    counted = wait_for(
        "a stream of full-disk errors",
        lambda: _full_errors_counted(port),
        accept=lambda n: n >= 40,
    )
    lines = _full_lines(daemon)
    # Each child says each failing call once (the same words at most once per 30 s),
    # and lost leases ten at a time: far fewer lines than errors.
    assert 0 < len(lines) <= 40, "\n".join(lines[:60])
    assert len(lines) < counted, (len(lines), counted)
    status, body = healthz(port)
    assert status == 503, body
    assert any("want of space" in problem for problem in body["problems"]), body

    small_disk.free()
    done = wait_for(
        "every task to succeed once the disk has room",
        lambda: stats("sqlite", str(path))["default"],
        timeout=90,
        accept=lambda s: s["succeeded"] == len(ids),
    )
    assert done["failed"] == 0, done
    # Healthy again once no write has been refused for FULL_RECENT_S.
    wait_for(
        "/healthz to recover", lambda: healthz(port), timeout=FULL_RECENT_S + 30,
        accept=lambda r: r[0] == 200,
    )  # fmt: skip


BIG = 256 * 1024  # a result far larger than the room left; a claim's pages fit


async def test_a_worker_whose_results_cannot_be_written_stops_claiming(
    small_disk: SmallDisk,
) -> None:
    """A disk with room for a claim's few pages but not for a big result: the worker
    claimed task after task it could never settle. It holds its claims until a result
    is written, then claims again, and no task runs twice."""
    path = small_disk.path / "tasks.db"
    async with CairnQ.sqlite(str(path)) as client:
        submitted = await client.submit_many(
            [{"name": "f.big", "payload": {"i": i}} for i in range(TASKS)]
        )
    errors = ErrorLog()
    worker = Worker(
        SQLiteStore(str(path)),
        concurrency=1,
        prefetch=0,
        on_error=errors,
    )
    release = asyncio.Event()
    started: list[int] = []

    @worker.task("f.big")
    async def big(ctx: TaskContext, payload: dict[str, int]) -> dict[str, Any]:
        started.append(payload["i"])
        await release.wait()
        return {"done": payload["i"], "blob": "x" * BIG}

    runner = asyncio.create_task(worker.run())
    try:
        await wait_for_async("the first task to start", lambda: len(started) == 1)
        small_disk.fill(path)
        small_disk.leave(64 * 1024)
        release.set()
        await wait_for_async(
            "the result's write to fail for want of space",
            lambda: any(_is_sqlite_full(exc) for exc, _ in errors.calls),
        )
        # Long enough for several claims, had the worker gone on claiming: each
        # takes a task it cannot settle and runs it for nothing.
        refused = len(errors.calls)
        await wait_for_async(
            "the result's write to be refused again and again",
            lambda: len(errors.calls),
            accept=lambda n: n >= refused + 8,
        )
        assert started == [0], f"claimed and ran {started} while no result could be written"
        small_disk.free()
        async with CairnQ.sqlite(str(path)) as client:

            async def statuses() -> list[str]:
                found = [await client.get(t.id) for t in submitted]
                return [t.status if t is not None else "missing" for t in found]

            await wait_for_async(
                "every task to succeed", statuses, 60, accept=lambda s: s == ["succeeded"] * TASKS
            )
            done = [await client.get(t.id) for t in submitted]
        assert all(t is not None and t.attempt == 1 for t in done), "a task ran twice"
    finally:
        release.set()
        worker.stop()
        await asyncio.wait_for(runner, 30)


async def test_with_no_result_left_to_retry_one_claim_tries_the_disk_now_and_then(
    small_disk: SmallDisk,
) -> None:
    """The disk stays full past the leases: the refused results are dropped, and the
    worker tries the disk with a claim every few seconds instead of four times a
    second, then claims as usual once there is room."""
    path = small_disk.path / "tasks.db"
    async with CairnQ.sqlite(str(path)) as client:
        submitted = await client.submit_many(
            [{"name": "f.once", "payload": {"i": i}} for i in range(TASKS)]
        )
    errors: list[tuple[BaseException, dict[str, Any]]] = []

    def note(exc: BaseException, info: dict[str, Any]) -> None:
        errors.append((exc, {**info, "at": asyncio.get_running_loop().time()}))

    worker = Worker(SQLiteStore(str(path)), concurrency=2, prefetch=0, lease_ms=2000, on_error=note)
    release = asyncio.Event()

    @worker.task("f.once")
    async def once(ctx: TaskContext, payload: dict[str, int]) -> dict[str, int]:
        await release.wait()
        return {"done": payload["i"]}

    def claims_refused() -> list[float]:
        return [info["at"] for exc, info in errors if info.get("phase") == "claim"]

    runner = asyncio.create_task(worker.run())
    try:
        await wait_for_async("two tasks to run", lambda: worker.in_flight.executing == 2)
        small_disk.fill(path)
        release.set()
        await wait_for_async(
            "the results' write to fail for want of space",
            lambda: any(_is_sqlite_full(exc) for exc, _ in errors),
        )
        loop = asyncio.get_running_loop()
        await wait_for_async("the leases to pass and a claim to try the disk", claims_refused, 30)
        since = loop.time()
        # Ten seconds of a full disk: a claim every 0.25 s would be 40.
        await wait_for_async("ten seconds of a full disk", lambda: loop.time() - since >= 10, 30)
        tries = [at for at in claims_refused() if at >= since]
        assert 1 <= len(tries) <= 4, tries
        small_disk.free()
        async with CairnQ.sqlite(str(path)) as client:

            async def statuses() -> list[str]:
                found = [await client.get(t.id) for t in submitted]
                return [t.status if t is not None else "missing" for t in found]

            await wait_for_async(
                "every task to succeed", statuses, 60, accept=lambda s: s == ["succeeded"] * TASKS
            )
    finally:
        release.set()
        worker.stop()
        await asyncio.wait_for(runner, 30)


async def test_a_progress_write_refused_for_want_of_space_holds_claims_too(
    small_disk: SmallDisk,
) -> None:
    """A handler's `ctx.progress` is a write like a result: refused for want of space,
    it holds the worker's claims, and the next write that goes through ends the hold."""
    path = small_disk.path / "tasks.db"
    async with CairnQ.sqlite(str(path)) as client:
        await client.submit("f.report", {})
    worker = Worker(SQLiteStore(str(path)), concurrency=2, prefetch=0)
    refused: list[BaseException] = []
    holds: list[float | None] = []
    go = asyncio.Event()
    done = asyncio.Event()

    @worker.task("f.report")
    async def report(ctx: TaskContext, payload: Any) -> str:
        await go.wait()
        try:
            await ctx.progress(0.5, "m" * BIG)
        except Exception as exc:
            refused.append(exc)
        holds.append(worker._settlement.space_hold())
        small_disk.free()
        await ctx.progress(0.9, "small")
        holds.append(worker._settlement.space_hold())
        done.set()
        return "ok"

    runner = asyncio.create_task(worker.run())
    try:
        await wait_for_async("the handler to start", lambda: worker.in_flight.executing == 1)
        small_disk.fill(path)
        small_disk.leave(64 * 1024)
        go.set()
        await asyncio.wait_for(done.wait(), 60)
        assert refused and _is_sqlite_full(refused[0]), refused
        assert holds[0] is not None, "a refused progress write did not hold claims"
        assert holds[1] is None, "a progress write that went through did not end the hold"
    finally:
        go.set()
        worker.stop()
        await asyncio.wait_for(runner, 30)
