"""Task dependencies: what a graph costs to drain, and how soon a released task starts.

    python -m bench.deps [--backend sqlite|postgres ...] [--repeats 3] \
        [--tasks 10000] [--width 1000] [--procs 2] [--pairs 300]

Per backend, measured round-robin (`bench.common.run_cases`), each run on a fresh
database, with cairnqd's own worker processes (`bench/worker_proc.py --impl ours`):

- `flat`: `--tasks` `bench.noop` tasks with no edges, drained by `--procs` processes;
  tasks/s from GO to the last completion (the rows' `completed_at_ms`).
- `graph`: the same number of tasks as fan-ins: groups of `--width - 1` parents and one
  join submitted after all of them, each group in one `submit_many`. The joins are
  released as their last parent succeeds, so the drain ends with the last join. The
  ratio graph / flat is the cost of the edges.
- `release`: one worker process; `--pairs` pairs (a parent, then a child submitted
  after it) are submitted one pair every 10 ms while it runs. For each child, the time
  from its parent's `completed_at_ms` (the settle that released it) to its handler's
  start (`--stamp`): p50 / p95 / p99 / max in ms.

Compare `flat` with a drain of the commit before the dependency triggers with
`python -m bench.ab` (the drain there runs the same worker).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any

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
from bench.drain import Table

PAIR_GAP_S = 0.010


#: Tasks not yet succeeded: a run ends when this counts 0.
UNFINISHED = "select count(*) from cairnq_tasks where status <> 'succeeded'"


async def _preload(backend: Backend, target: str, tasks: int, width: int | None) -> None:
    """`tasks` no-op tasks: flat in chunks of 1,000, or as fan-ins of `width`."""
    chunk = width or 1_000
    async with ours_client(backend, target) as client:
        for offset in range(0, tasks, chunk):
            size = min(chunk, tasks - offset)
            items: list[dict[str, Any]] = [
                {"name": NOOP, "payload": {"i": offset + i}} for i in range(size)
            ]
            if width is not None and size > 1:
                items[-1]["after"] = list(range(size - 1))
            await client.submit_many(items)


async def drain_once(backend: Backend, args: argparse.Namespace, shape: str) -> Run:
    async with fresh_target(backend, f"deps_{shape}") as target:
        width = args.width if shape == "graph" else None
        await _preload(backend, target, args.tasks, width)
        argv = worker_argv("ours", backend, target, concurrency=args.concurrency)
        workers = [(f"w{i}", argv) for i in range(args.procs)]
        async with children(workers) as started, Table(backend, target) as table:
            go = await release(started)
            await table.wait_until_zero(UNFINISHED, args.timeout)
            last_ms = await table.scalar("select max(completed_at_ms) from cairnq_tasks")
        seconds = last_ms / 1000 - go
        return Run({"tasks_per_s": args.tasks / seconds, "seconds": seconds})


async def release_once(backend: Backend, args: argparse.Namespace) -> Run:
    async with fresh_target(backend, "deps_release") as target:
        async with ours_client(backend, target) as client:
            await client.stats()  # migrate before the worker starts
        argv = worker_argv("ours", backend, target, concurrency=args.concurrency, stamp=True)
        async with children([("w", argv)]) as started, ours_client(backend, target) as client:
            await release(started)
            pairs: list[tuple[str, str]] = []
            for i in range(args.pairs):
                parent, child = await client.submit_many(
                    [{"name": NOOP, "payload": {"i": i}}, {"name": NOOP, "after": [0]}]
                )
                pairs.append((parent.id, child.id))
                await asyncio.sleep(PAIR_GAP_S)
            async with Table(backend, target) as table:
                await table.wait_until_zero(UNFINISHED, args.timeout)
            latencies: list[float] = []
            for parent_id, child_id in pairs:
                parent, child = await client.get(parent_id), await client.get(child_id)
                assert parent is not None and child is not None
                assert parent.completed_at_ms is not None and isinstance(child.result, dict)
                latencies.append(child.result["t"] * 1000 - parent.completed_at_ms)
    return Run(
        {
            "p50_ms": percentile(latencies, 50),
            "p95_ms": percentile(latencies, 95),
            "p99_ms": percentile(latencies, 99),
            "max_ms": max(latencies),
        }
    )


def report(points: Sequence[Point]) -> None:
    by = {(p.labels["backend"], p.labels["case"]): p for p in points}
    rows = []
    for backend in dict.fromkeys(p.labels["backend"] for p in points):
        flat, graph, rel = (
            by.get((backend, "flat")),
            by.get((backend, "graph")),
            by.get((backend, "release")),
        )
        f = flat.median("tasks_per_s") if flat else None
        g = graph.median("tasks_per_s") if graph else None
        ratio = f"{g / f:.2f}" if f and g else "-"
        lat = (
            " / ".join(fmt(rel.median(k), 1) for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms"))
            if rel
            else "-"
        )
        rows.append([backend, fmt(f), fmt(g), ratio, lat])
    print_table(
        "Dependencies (medians)",
        ["backend", "flat tasks/s", "graph tasks/s", "graph/flat", "release p50/p95/p99/max ms"],
        rows,
    )


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--width", type=int, default=1_000, help="tasks per fan-in, join included")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", default="deps", help="bench/out/<name>.json")
    args = parser.parse_args(argv)
    if args.width < 2:
        parser.error("--width must be at least 2 (a parent and its join)")
    cases: list[Case] = []
    for backend in chosen_backends(args):
        for shape in ("flat", "graph"):

            async def drain(run: int, b: Backend = backend, shape: str = shape) -> Run:
                return await drain_once(b, args, shape)

            cases.append(Case({"backend": backend, "case": shape}, drain))

        async def rel(run: int, b: Backend = backend) -> Run:
            return await release_once(b, args)

        cases.append(Case({"backend": backend, "case": "release"}, rel))
    config = {k: v for k, v in vars(args).items() if k != "backend"}
    points = await run_cases(cases, args.repeats, lambda pts: save(args.out, config, pts))
    report(points)


if __name__ == "__main__":
    main_entry(main)
