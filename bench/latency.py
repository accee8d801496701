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

Stream mode (`--rate R`): the driver submits one task every 1/R s on a fixed schedule
(open loop: a submit that runs late does not push the schedule back) for `--seconds`,
while one worker process runs them; pickup is each task's handler start minus the
moment its submit returned. Rows: ours (a bare worker process), the daemon (`cairnqd`
with one group of two children, `bench.stamp` from bench/daemon_handlers.py), on
Postgres the daemon with `direct_dsn` (daemon-relay: the parent holds the one LISTEN and
wakes one child with a free slot per notification), the daemon with
`connections_per_child: 2` (daemon-2conn: a child's results write beside its claims),
the daemon with four children (daemon-4: each notification wakes all four) and with
one (daemon-1: what a child costs beside a bare worker, without a sibling), the public
SDK (25 ms poll: at its default of 500 ms it cannot keep up) and, on
Postgres, pgqueuer. Besides the whole run's
percentiles (the first second, the warm-up, left out) it reports p50/p95/p99/max per
second of the run, so a stall shows where it happened, and the CPU each task cost: the
worker's processes (a daemon's parent and children together), the driver (its
submits, through each implementation's own client) and every CPU of the machine (the
database server included). On two cores at 800/s
the machine is nearly saturated, so the CPU a task costs is what moves the tail:

    python -m bench.latency --rate 800 --seconds 20 [--backend ...] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml

from bench import peers
from bench.common import (
    NOOP,
    QUEUE,
    Backend,
    Case,
    Point,
    Run,
    add_common_args,
    busy_cpu_s,
    children,
    chosen_backends,
    fmt,
    fresh_target,
    main_entry,
    ours_client,
    percentile,
    print_table,
    process_cpu_s,
    release,
    run_cases,
    save,
    worker_argv,
)
from bench.daemon import ENV, children_of, daemon_config, process_title
from bench.drain import Table

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


STREAM_VARIANTS: tuple[tuple[str, int | None], ...] = (
    ("ours", None),
    ("daemon", None),
    ("daemon-relay", None),
    ("daemon-2conn", None),
    ("daemon-4", None),
    ("daemon-1", None),
    ("cairnq", 25),
    ("pgqueuer", None),
)
DAEMON_CHILDREN = 2
#: The daemon as configured by default (each child LISTENs on Postgres), with
#: `direct_dsn` (the parent holds the one LISTEN and routes wake-ups to the children),
#: with `connections_per_child: 2` (a child's results write beside its claims), and
#: with four children instead of two.
DAEMONS = ("daemon", "daemon-relay", "daemon-2conn", "daemon-4", "daemon-1")


@asynccontextmanager
async def daemon_serving(
    backend: Backend,
    target: str,
    scratch: Path,
    *,
    relay: bool = False,
    connections: int = 1,
    processes: int = DAEMON_CHILDREN,
) -> AsyncIterator[int]:
    """`cairnqd` with one group of `processes` children (concurrency 8, prefetch
    auto) on the queue, serving bench/daemon_handlers.py; yields the parent's pid once
    every child is ready, stopped (TERM) on exit. `relay` (Postgres): `direct_dsn` set to the same
    DSN, so the parent holds the one LISTEN and routes wake-ups to the children.
    `connections`: `database.connections_per_child`."""
    run_dir = scratch / "run"
    run_dir.mkdir()
    database: dict[str, Any] = (
        {"path": target} if backend == "sqlite" else {"dsn": target, "auto_migrate": True}
    )
    if relay and backend == "postgres":
        database["direct_dsn"] = target
    if connections != 1:
        database["connections_per_child"] = connections
    group = {"queues": [QUEUE], "processes": processes, "concurrency": 8}
    config = daemon_config(database, run_dir, {"stream": group})
    path = scratch / "cairnq.yaml"
    path.write_text(yaml.safe_dump(config))
    with (scratch / "daemon.log").open("ab") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cairnqd.cli", "-c", str(path), stdout=log, stderr=log, env=ENV
        )
    try:
        deadline = time.monotonic() + 60
        while sum(process_title(p).endswith(" ready") for p in children_of(proc.pid)) < processes:
            if proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon's children never got ready: {scratch}/daemon.log")
            await asyncio.sleep(0.1)
        yield proc.pid
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def read_sdk_starts(
    backend: Backend, target: str, n: int, timeout_s: float
) -> dict[int, float]:
    """Task number -> handler start, from the results once all `n` tasks succeeded."""
    async with Table(backend, target) as table:
        deadline = time.monotonic() + timeout_s
        while await table.scalar(DONE) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"not all {n} tasks succeeded within {timeout_s:.0f}s")
            await asyncio.sleep(0.1)
        rows = await table.rows(RESULTS)
    starts: dict[int, float] = {}
    for payload, result in rows:
        payload = json.loads(payload) if isinstance(payload, str) else payload
        result = json.loads(result) if isinstance(result, str) else result
        starts[int(payload["i"])] = float(result["t"])
    return starts


async def read_stamps(stamps: Path, n: int, timeout_s: float) -> dict[int, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        lines = (await asyncio.to_thread(stamps.read_text)).splitlines()
        complete = [line.split() for line in lines if line.count(" ") == 1]
        if len(complete) >= n:
            return {int(i): float(t) for i, t in complete}
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(complete)} of {n} jobs started within {timeout_s:.0f}s")
        await asyncio.sleep(0.1)


DONE = "select count(*) from cairnq_tasks where status = 'succeeded'"
RESULTS = "select payload, result from cairnq_tasks where status = 'succeeded'"


def per_second(submitted: Sequence[float], pickups: Sequence[float]) -> list[dict[str, float]]:
    """p50/p95/p99/max of the pickups of the tasks submitted in each second of the run."""
    first = submitted[0]
    buckets: dict[int, list[float]] = {}
    for at, pickup in zip(submitted, pickups, strict=True):
        buckets.setdefault(int(at - first), []).append(pickup)
    return [
        {
            "second": k,
            "n": len(v),
            "p50": percentile(v, 50),
            "p95": percentile(v, 95),
            "p99": percentile(v, 99),
            "max": max(v),
        }
        for k, v in sorted(buckets.items())
    ]


async def stream_once(
    backend: Backend, impl: str, poll_ms: int | None, args: argparse.Namespace
) -> Run:
    n = int(args.rate * args.seconds)
    gap = 1.0 / args.rate
    submitted = [0.0] * n
    with tempfile.TemporaryDirectory(prefix="latency-") as scratch:
        stamps = Path(scratch) / "stamps"
        stamps.touch()
        peer = impl in peers.PEERS
        async with fresh_target(backend, "latency") as target:
            argv = worker_argv(
                "ours" if impl in DAEMONS else impl,
                backend,
                target,
                poll_interval_ms=poll_ms,
                stamp=not peer,
                stamp_file=str(stamps) if peer else None,
            )
            async with contextlib.AsyncExitStack() as stack:
                if peer:
                    one, _ = await stack.enter_async_context(peers.enqueuer(impl, target))
                else:
                    client = await stack.enter_async_context(ours_client(backend, target))
                    name = "bench.stamp" if impl in DAEMONS else NOOP

                    async def one(i: int) -> None:
                        await client.submit(name, {"i": i})

                if impl in DAEMONS:
                    parent = await stack.enter_async_context(
                        daemon_serving(
                            backend,
                            target,
                            Path(scratch),
                            relay=impl == "daemon-relay",
                            connections=2 if impl == "daemon-2conn" else 1,
                            processes={"daemon-4": 4, "daemon-1": 1}.get(impl, DAEMON_CHILDREN),
                        )
                    )
                    serving = [parent, *children_of(parent)]
                else:
                    workers = await stack.enter_async_context(children([(f"{impl}-stream", argv)]))
                    await release(workers)
                    serving = [w.pid for w in workers]
                await asyncio.sleep(1.0)  # the worker settles into its idle wait
                cpu_before, busy_before = process_cpu_s(serving), busy_cpu_s()
                driver_before = time.process_time()
                start = time.perf_counter()
                for i in range(n):
                    late = start + i * gap - time.perf_counter()
                    if late > 0:
                        await asyncio.sleep(late)
                    await one(i)
                    submitted[i] = time.time()
                took = time.perf_counter() - start
                timeout = args.seconds + 60
                starts = (
                    await read_stamps(stamps, n, timeout)
                    if peer
                    else await read_sdk_starts(backend, target, n, timeout)
                )
                worker_cpu_s = process_cpu_s(serving) - cpu_before
                driver_cpu_s = time.process_time() - driver_before
                busy_s = busy_cpu_s() - busy_before
    pickups = [(starts[i] - submitted[i]) * 1000 for i in range(n)]
    seconds = per_second(submitted, pickups)
    counted = [p for p, at in zip(pickups, submitted, strict=True) if at - submitted[0] >= 1.0]
    return Run(
        {
            "p50_ms": percentile(counted, 50),
            "p95_ms": percentile(counted, 95),
            "p99_ms": percentile(counted, 99),
            "max_ms": max(counted),
            "submitted_per_s": n / took,
            # What the worker's processes spent per task, the driver (its submits), and
            # every CPU of the machine (the database server and the kernel included).
            "worker_cpu_us": worker_cpu_s / n * 1e6,
            "driver_cpu_us": driver_cpu_s / n * 1e6,
            "all_cpu_us": busy_s / n * 1e6,
        },
        {"per_second": seconds},
    )


def median_rows(points: Sequence[Point], columns: Sequence[tuple[str, int]]) -> list[list[str]]:
    """Per point: its backend, impl and poll, then the medians of `columns` (metric,
    digits shown)."""
    return [
        [p.labels["backend"], p.labels["impl"], p.labels["poll"]]
        + [fmt(p.median(key), digits) for key, digits in columns]
        for p in points
    ]


def report_stream(points: Sequence[Point]) -> None:
    columns = [
        ("submitted_per_s", 0),
        ("p50_ms", 2),
        ("p95_ms", 2),
        ("p99_ms", 2),
        ("max_ms", 1),
        ("worker_cpu_us", 0),
        ("driver_cpu_us", 0),
        ("all_cpu_us", 0),
    ]
    rows = median_rows(points, columns)
    print_table(
        "pickup latency under a stream, ms (median of runs; the first second left out), "
        "and CPU per task, µs (the worker's processes; the driver; all CPUs)",
        [
            "backend",
            "impl",
            "poll",
            "submitted/s",
            "p50",
            "p95",
            "p99",
            "max",
            "worker CPU",
            "driver CPU",
            "all CPU",
        ],
        rows,
    )
    for p in points:
        # The run whose p99 is the median's: its seconds, one line each.
        run = sorted(p.runs, key=lambda r: r.metrics["p99_ms"])[len(p.runs) // 2]
        print_table(
            f"per second: {p.labels['backend']} {p.labels['impl']} (the median run by p99)",
            ["second", "tasks", "p50", "p95", "p99", "max"],
            [
                [str(s["second"]), str(s["n"])]
                + [fmt(s[k], 1) for k in ("p50", "p95", "p99", "max")]
                for s in run.detail["per_second"]
            ],
        )


def report(points: Sequence[Point]) -> None:
    columns = [("p50_ms", 1), ("p99_ms", 1), ("mean_ms", 1), ("max_ms", 1)]
    rows = median_rows(points, [*columns, ("round_trip_p50_ms", 1)])
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
        "--impl",
        action="append",
        choices=[
            "ours",
            "daemon",
            "daemon-relay",
            "daemon-2conn",
            "daemon-4",
            "daemon-1",
            "cairnq",
            "procrastinate",
            "pgqueuer",
        ],
    )
    parser.add_argument("--rate", type=float, help="stream mode: tasks submitted a second")
    parser.add_argument("--seconds", type=float, default=20.0, help="stream mode: its length")
    parser.add_argument("--out", default=None, help="bench/out/<name>.json")
    args = parser.parse_args(argv)
    stream = args.rate is not None
    out = args.out or ("latency-stream" if stream else "latency")
    cases: list[Case] = []
    for backend in chosen_backends(args):
        for impl, poll_ms in STREAM_VARIANTS if stream else VARIANTS:
            if args.impl and impl not in args.impl:
                continue
            if impl in peers.PEERS and (backend != "postgres" or not peers.available(impl)):
                continue
            if impl == "daemon-relay" and backend != "postgres":
                continue  # no LISTEN to relay: SQLite children watch the file
            if impl in peers.PEERS:
                poll = "its default (LISTEN)"
            elif impl in DAEMONS:
                poll = "group default (1 s)"
            else:
                poll = "default (500)" if poll_ms is None else f"{poll_ms} ms"
            labels = {"backend": backend, "impl": impl, "poll": poll}

            async def once(
                run: int, impl: str = impl, poll_ms: int | None = poll_ms, b: Backend = backend
            ) -> Run:
                if stream:
                    return await stream_once(b, impl, poll_ms, args)
                return await latency_once(b, impl, poll_ms, args, seed=run + 1)

            cases.append(Case(labels, once))
    config = {k: v for k, v in vars(args).items() if k != "backend"}
    points = await run_cases(cases, args.repeats, lambda pts: save(out, config, pts))
    (report_stream if stream else report)(points)


if __name__ == "__main__":
    main_entry(main)
