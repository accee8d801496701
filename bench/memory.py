"""Worker memory: RSS of one worker process idle, then after 1k, 10k, 50k and 100k tasks.

    python -m bench.memory [--backend sqlite|postgres]... [--impl ours|cairnq]...
                           [--milestones 1000,10000,50000,100000]

One worker process (`bench/worker_proc.py`, concurrency 8, no-op handler). The driver
reads VmRSS from /proc/<pid>/status: after 2 s idle, then each time the worker has
drained everything submitted so far (tasks go in with cairnqd's `submit_many`, 1,000
per call, while the worker runs). Growth per task between the last two milestones
shows whether anything accumulates per task. A single run (no median): RSS is not
noisy the way throughput is.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence

from bench.common import (
    NOOP,
    Backend,
    Point,
    Run,
    add_common_args,
    children,
    chosen_backends,
    fmt,
    fresh_target,
    main_entry,
    ours_client,
    print_table,
    read_rss_kib,
    release,
    save,
    wait_for_quiet,
    worker_argv,
)
from bench.drain import CAIRNQ_PENDING, Table

CHUNK = 1000


async def memory_once(
    backend: Backend, impl: str, milestones: Sequence[int], timeout_s: float
) -> Run:
    metrics: dict[str, float] = {}
    timeline: list[dict[str, float]] = []
    async with (
        fresh_target(backend, "memory") as target,
        ours_client(backend, target) as client,
        Table(backend, target) as table,
        children([(f"{impl}-memory", worker_argv(impl, backend, target))]) as workers,
    ):
        pid = workers[0].pid
        metrics["rss_start_kib"] = read_rss_kib(pid)
        await release(workers)
        await asyncio.sleep(2.0)
        metrics["rss_idle_kib"] = read_rss_kib(pid)
        submitted = 0
        start = time.monotonic()
        for milestone in milestones:
            while submitted < milestone:
                size = min(CHUNK, milestone - submitted)
                await client.submit_many(
                    [{"name": NOOP, "payload": {"i": submitted + i}} for i in range(size)]
                )
                submitted += size
            await table.wait_until_zero(CAIRNQ_PENDING, timeout_s)
            await asyncio.sleep(0.5)
            rss = read_rss_kib(pid)
            metrics[f"rss_{milestone}_kib"] = rss
            timeline.append(
                {"tasks": milestone, "rss_kib": rss, "at_s": round(time.monotonic() - start, 2)}
            )
        if len(milestones) >= 2:
            a, b = milestones[-2], milestones[-1]
            grown = metrics[f"rss_{b}_kib"] - metrics[f"rss_{a}_kib"]
            metrics["growth_bytes_per_task"] = grown * 1024 / (b - a)
    return Run(metrics, {"timeline": timeline})


def report(points: Sequence[Point], milestones: Sequence[int]) -> None:
    columns = ["backend", "impl", "idle MiB", *[f"after {m:,} MiB" for m in milestones]]
    rows = []
    for p in points:
        mib = [p.median("rss_idle_kib"), *[p.median(f"rss_{m}_kib") for m in milestones]]
        rows.append(
            [
                p.labels["backend"],
                p.labels["impl"],
                *[fmt(None if v is None else v / 1024, 1) for v in mib],
            ]
        )
    print_table("worker RSS", [*columns], rows)
    for p in points:
        growth = p.median("growth_bytes_per_task")
        if growth is not None:
            print(
                f"{p.labels['backend']} {p.labels['impl']}: "
                f"{growth:+.2f} bytes/task between the last two milestones"
            )


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.set_defaults(repeats=1)
    parser.add_argument("--impl", action="append", choices=["ours", "cairnq"])
    parser.add_argument("--milestones", default="1000,10000,50000,100000")
    parser.add_argument("--timeout", type=float, default=600.0, help="per milestone")
    parser.add_argument("--out", default="memory")
    args = parser.parse_args(argv)
    milestones = [int(m) for m in args.milestones.split(",")]
    points: list[Point] = []
    for backend in chosen_backends(args):
        for impl in args.impl or ["ours"]:
            labels = {"backend": backend, "impl": impl}
            runs = []
            for _ in range(args.repeats):
                await wait_for_quiet()
                runs.append(await memory_once(backend, impl, milestones, args.timeout))
            points.append(Point(labels, runs))
            print(f"  [{backend} {impl}] {runs[-1].metrics}", flush=True)
    report(points, milestones)
    config = {k: v for k, v in vars(args).items() if k != "backend"}
    await save(args.out, config, points)


if __name__ == "__main__":
    main_entry(main)
