"""Idle pickup latency: submit one task to an idle worker, time until its handler starts.

    python -m bench.latency [--backend sqlite|postgres]... [--tasks 200] [--repeats 3]

One worker process (`bench/worker_proc.py --stamp`, concurrency 8) whose `bench.noop`
returns `{"t": time.time()}` read as the handler starts. The driver, for each task:
sleeps a random 5-20 ms, submits (cairnqd's client), notes the wall clock when
`submit` has returned (the row is committed), waits for the task to finish, and
computes pickup = result.t - submit end. Same host, same clock. The worker is idle at
every submit because the previous task has finished. The first `--warmup` tasks are
not counted.

Rows: each SDK with its default `poll_interval_ms` (500) and tuned to 25 ms; on
Postgres also procrastinate and pgqueuer with their defaults (both LISTEN). The peers
keep no result, so their handler appends `<i> <time>` to a stamp file the driver
watches, and they are submitted through their own enqueue call.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from bench import peers
from bench.common import (
    NOOP,
    Backend,
    Case,
    Point,
    Run,
    add_common_args,
    children,
    chosen_backends,
    fmt,
    fresh_target,
    main_entry,
    ours_client,
    percentile,
    print_table,
    release,
    run_cases,
    save,
    worker_argv,
)

VARIANTS: tuple[tuple[str, int | None], ...] = (
    ("ours", None),
    ("ours", 25),
    ("cairnq", None),
    ("cairnq", 25),
    ("procrastinate", None),
    ("pgqueuer", None),
)

# One submitted job: (submit it, then wait for its handler) -> handler start time.
Probe = Callable[[int], Awaitable[tuple[float, float]]]


@asynccontextmanager
async def sdk_probe(backend: Backend, target: str) -> AsyncIterator[Probe]:
    """Submit with cairnqd's client; the handler's start time comes back as its result."""
    async with ours_client(backend, target) as client:

        async def probe(i: int) -> tuple[float, float]:
            task = await client.submit(NOOP, {"i": i})
            submitted = time.time()
            done = await client.wait(task.id, timeout_ms=10_000, poll_ms=2, max_poll_ms=10)
            if done.status != "succeeded" or not isinstance(done.result, dict):
                raise RuntimeError(f"task {task.id} ended {done.status}: {done.error}")
            return submitted, float(done.result["t"])

        yield probe


@asynccontextmanager
async def peer_probe(peer: str, target: str, stamps: Path) -> AsyncIterator[Probe]:
    """Submit with the peer's own enqueue; read the start time from the stamp file."""
    seen: dict[int, float] = {}
    offset = 0

    async def stamp_of(i: int) -> float:
        nonlocal offset
        deadline = time.monotonic() + 10
        while i not in seen:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{peer}: job {i} never started")
            with stamps.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            offset += len(complete)
            for line in complete.decode().splitlines():
                number, started = line.split()
                seen[int(number)] = float(started)
            if i not in seen:
                await asyncio.sleep(0.0005)
        return seen.pop(i)

    async with peers.enqueuer(peer, target) as (one, _):

        async def probe(i: int) -> tuple[float, float]:
            await one(i)
            submitted = time.time()
            return submitted, await stamp_of(i)

        yield probe


async def latency_once(
    backend: Backend, impl: str, poll_ms: int | None, args: argparse.Namespace, seed: int
) -> Run:
    rng = random.Random(seed)
    pickups: list[float] = []
    round_trips: list[float] = []
    with tempfile.TemporaryDirectory(prefix="latency-") as scratch:
        stamps = Path(scratch) / "stamps"
        stamps.touch()
        peer = impl in peers.PEERS
        # The driver connects (and installs the schema) first, then the worker starts.
        async with fresh_target(backend, "latency") as target:
            probing = peer_probe(impl, target, stamps) if peer else sdk_probe(backend, target)
            argv = worker_argv(
                impl,
                backend,
                target,
                poll_interval_ms=poll_ms,
                stamp=not peer,
                stamp_file=str(stamps) if peer else None,
            )
            async with probing as probe, children([(f"{impl}-latency", argv)]) as workers:
                await release(workers)
                for i in range(args.warmup + args.tasks):
                    await asyncio.sleep(rng.uniform(0.005, 0.020))
                    begin = time.time()
                    submitted, started = await probe(i)
                    finished = time.time()
                    if i >= args.warmup:
                        pickups.append((started - submitted) * 1000)
                        round_trips.append((finished - begin) * 1000)
    return Run(
        {
            "p50_ms": percentile(pickups, 50),
            "p99_ms": percentile(pickups, 99),
            "mean_ms": statistics.fmean(pickups),
            "max_ms": max(pickups),
            "round_trip_p50_ms": percentile(round_trips, 50),
        },
        {"pickups_ms": [round(p, 3) for p in pickups]},
    )


def report(points: Sequence[Point]) -> None:
    rows = [
        [
            p.labels["backend"],
            p.labels["impl"],
            p.labels["poll"],
            fmt(p.median("p50_ms"), 1),
            fmt(p.median("p99_ms"), 1),
            fmt(p.median("mean_ms"), 1),
            fmt(p.median("max_ms"), 1),
            fmt(p.median("round_trip_p50_ms"), 1),
        ]
        for p in points
    ]
    print_table(
        "idle pickup latency, ms (median of runs)",
        ["backend", "impl", "poll", "p50", "p99", "mean", "max", "driver round trip p50"],
        rows,
    )


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--impl", action="append", choices=["ours", "cairnq", "procrastinate", "pgqueuer"]
    )
    parser.add_argument("--out", default="latency")
    args = parser.parse_args(argv)
    cases: list[Case] = []
    for backend in chosen_backends(args):
        for impl, poll_ms in VARIANTS:
            if args.impl and impl not in args.impl:
                continue
            if impl in peers.PEERS and (backend != "postgres" or not peers.available(impl)):
                continue
            if impl in peers.PEERS:
                poll = "its default (LISTEN)"
            else:
                poll = "default (500)" if poll_ms is None else f"{poll_ms} ms"
            labels = {"backend": backend, "impl": impl, "poll": poll}

            async def once(
                run: int, impl: str = impl, poll_ms: int | None = poll_ms, b: Backend = backend
            ) -> Run:
                return await latency_once(b, impl, poll_ms, args, seed=run + 1)

            cases.append(Case(labels, once))
    config = {k: v for k, v in vars(args).items() if k != "backend"}
    points = await run_cases(cases, args.repeats, lambda pts: save(args.out, config, pts))
    report(points)


if __name__ == "__main__":
    main_entry(main)
