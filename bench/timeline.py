"""Where a pickup's milliseconds go under a stream: a timeline per task.

    python -m bench.timeline [--backend sqlite|postgres] [--rate 800] [--seconds 10]

One worker (concurrency 8, prefetch auto) runs in this process, instrumented; a
submitter process submits one task every 1/rate s on a fixed schedule and records when
each submit returned. Per task: the submit's return, the start and end of the claim
cycle that took it (`ClaimLoop._claim`: what the loop does before the task can start,
results written in the claim included), and the handler's start. The report splits each
pickup into waiting for a claim to begin, the claim, and the hand-off to the handler,
and lists the statements run meanwhile (count, mean time from the driver's side), so a
cost on the way to the handler has a name. The first second is left out.

Instrumentation wraps private methods (`ClaimLoop._claim`, the dialect's statement
runner): this is a profiling tool, not a benchmark of record; bench.latency --rate is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import Backend, fresh_target, main_entry, ours_client, percentile

SUBMITTER = """
import asyncio, json, sys, time
import cairnqd

async def main() -> None:
    backend, target, rate, n, out = sys.argv[1:6]
    client = (cairnqd.CairnQ.sqlite(target) if backend == "sqlite"
              else cairnqd.CairnQ.postgres(target))
    async with client:
        returned = []
        start = time.perf_counter()
        for i in range(int(n)):
            late = start + i / float(rate) - time.perf_counter()
            if late > 0:
                await asyncio.sleep(late)
            await client.submit("bench.noop", {"i": i})
            returned.append(time.time())
    with open(out, "w") as f:
        json.dump(returned, f)

asyncio.run(main())
"""


class Statements:
    """Time spent in each statement, from the driver's side."""

    def __init__(self) -> None:
        self.count: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, run: Callable[..., Awaitable[Any]]) -> Any:
        """An async statement runner `run(conn, stmt, ...)`, timed."""

        async def timed(conn: Any, stmt: Any, *args: Any) -> Any:
            began = time.perf_counter()
            try:
                return await run(conn, stmt, *args)
            finally:
                self._count(stmt.name, began)

        return timed

    def wrap_sync(self, run: Callable[..., Any]) -> Any:
        """A statement runner on the loop's thread (SQLite's), timed."""

        def timed(conn: Any, stmt: Any, *args: Any) -> Any:
            began = time.perf_counter()
            try:
                return run(conn, stmt, *args)
            finally:
                self._count(stmt.name, began)

        return timed

    def _count(self, name: str, began: float) -> None:
        self.count[name] += 1
        self.seconds[name] += time.perf_counter() - began


#: Transaction control statements timed beside the named ones (Postgres).
_BARE = frozenset({"begin", "commit", "rollback"})


def instrument(backend: Backend, statements: Statements) -> None:
    """Time every statement the store runs (where its modules look the runner up)."""
    if backend == "postgres":
        import cairnqd.store.postgres.store as pg

        setattr(pg, "run", statements.wrap(pg.run))  # type: ignore[attr-defined]  # noqa: B010
        # A claim sent in one flight (store/postgres/flight.py), whole: inside it BEGIN
        # and COMMIT below time only their queueing.
        flight = pg.claim_in_one_flight  # type: ignore[attr-defined]

        async def timed_flight(*args: Any) -> Any:
            began = time.perf_counter()
            try:
                return await flight(*args)
            finally:
                statements._count("claim flight", began)

        setattr(pg, "claim_in_one_flight", timed_flight)  # noqa: B010
        # The transaction's own round trips, sent as plain text: BEGIN, COMMIT, ROLLBACK.
        import psycopg

        execute = psycopg.AsyncConnection.execute

        async def timed_execute(conn: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(query, str) or query.split(";")[-1].strip() not in _BARE:
                return await execute(conn, query, *args, **kwargs)
            began = time.perf_counter()
            try:
                return await execute(conn, query, *args, **kwargs)
            finally:
                statements._count(query.split(";")[-1].strip(), began)

        setattr(psycopg.AsyncConnection, "execute", timed_execute)  # noqa: B010
        return
    import cairnqd.store.sqlite.statements as lite
    import cairnqd.store.sqlite.store as lite_store

    timed = statements.wrap_sync(lite.run)
    lite.run = timed
    setattr(lite_store, "run", timed)  # noqa: B010 - imported there by name


async def timeline(backend: Backend, rate: float, seconds: float) -> None:
    from cairnqd import Worker
    from cairnqd._claimloop import ClaimLoop
    from cairnqd.context import TaskContext
    from cairnqd.models import Task

    n = int(rate * seconds)
    statements = Statements()
    instrument(backend, statements)
    # (began, ended, task numbers) of each claim cycle.
    cycles: list[tuple[float, float, list[int]]] = []
    claim = ClaimLoop._claim

    async def timed_claim(
        self: ClaimLoop, queues: Sequence[str], free: int, ahead: int
    ) -> list[Task]:
        began = time.time()
        tasks = await claim(self, queues, free, ahead)
        cycles.append((began, time.time(), [int(t.payload["i"]) for t in tasks]))
        return tasks

    setattr(ClaimLoop, "_claim", timed_claim)  # noqa: B010 - a private method, wrapped
    started: dict[int, float] = {}
    all_started = asyncio.Event()

    async def noop(ctx: TaskContext) -> None:
        started[int(ctx.payload["i"])] = time.time()
        if len(started) >= n:
            all_started.set()

    async with fresh_target(backend, "timeline") as target, ours_client(backend, target) as client:
        worker = Worker(client.store, ["default"], concurrency=8)
        worker.register("bench.noop", noop)
        running = asyncio.create_task(worker.run())
        await asyncio.sleep(1.0)
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "returned.json"
            submitter = await asyncio.create_subprocess_exec(
                sys.executable, "-c", SUBMITTER, backend, target, str(rate), str(n), str(out)
            )
            if await submitter.wait() != 0:
                raise RuntimeError("the submitter failed")
            returned: list[float] = json.loads(out.read_text())
        await asyncio.wait_for(all_started.wait(), 60)
        worker.stop()
        await running
    report(returned, started, cycles, statements)


def report(
    returned: list[float],
    started: dict[int, float],
    cycles: list[tuple[float, float, list[int]]],
    statements: Statements,
) -> None:
    by_task = {i: (began, ended) for began, ended, tasks in cycles for i in tasks}
    parts: dict[str, list[float]] = defaultdict(list)
    for i, at in enumerate(returned):
        if at - returned[0] < 1.0 or i not in started or i not in by_task:
            continue
        began, ended = by_task[i]
        parts["pickup"].append((started[i] - at) * 1000)
        # Negative: the claim that took it began before the submit had returned.
        parts["until the claim began"].append((began - at) * 1000)
        parts["the claim cycle"].append((ended - began) * 1000)
        parts["claim end to handler"].append((started[i] - ended) * 1000)
    print(f"{len(parts['pickup'])} tasks, {len(cycles)} claim cycles "
          f"({sum(1 for c in cycles if not c[2])} found nothing)")  # fmt: skip
    for name, values in parts.items():
        print(
            f"  {name:24} p50 {percentile(values, 50):6.2f}  p95 {percentile(values, 95):6.2f}"
            f"  p99 {percentile(values, 99):6.2f} ms"
        )
    sizes = [len(c[2]) for c in cycles if c[2]]
    print(f"  tasks per claim that found some: median {statistics.median(sizes):g}")
    print("statements (count, mean ms):")
    for name, total in sorted(statements.seconds.items(), key=lambda kv: -kv[1])[:10]:
        count = statements.count[name]
        print(f"  {name:40} {count:7d} {total / count * 1000:7.3f}")


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="postgres")
    parser.add_argument("--rate", type=float, default=800.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    await timeline(args.backend, args.rate, args.seconds)


if __name__ == "__main__":
    main_entry(main)
