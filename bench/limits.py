"""Flow-control limits: what a limit costs, and whether it holds.

    python -m bench.limits [--backend sqlite|postgres]... [--repeats 3]
                           [--tasks 20000] [--rate-seconds 60] [--case NAME]...

Cases, per backend, measured round-robin in one run (`run_cases`), two worker processes
each (`bench/worker_proc.py --impl ours`, prefetch auto):

- `unlimited`, `limited`: the drain of `--tasks` pre-loaded no-op tasks by processes of
  concurrency 32, without a limit and with `concurrency: 64` on the queue (room for
  every slot of both). The ratio is the limit's cost on the claim path.
- `serial`: 300 tasks whose handler sleeps 10 ms, processes of concurrency 4, under
  `concurrency: 1`: at most 100 tasks/s can exist; how close it gets.
- `rate`: no-op tasks under `rate: 200/1s` for `--rate-seconds`: the mean starts per
  second over the run, and the most claims (which the rate counts: never past 200) and
  the most handler starts in any 1 s window. A handler stamps its start and its claim's
  time by the database clock (its lease, less the lease's length) (`--stamp`).
- `raw256`: the bare SQL drain (bench/raw_proc.py, claim 256 + complete per
  transaction), two processes: the machine's limit beside the figures.
- `raw32`: the same with claims of 32: the shape a budget of 64 gives two processes
  (each commit settles 32 tasks and claims 32), so `raw32 ÷ raw256` is what the
  budget's smaller claims cost where nothing but the protocol's statements runs: the
  machine's limit beside `limited ÷ unlimited`.
- `raw_serial`: the bare SQL loop of `serial` (bench/raw_proc.py `--hold-ms 10`), one
  process: claim one task, commit, sleep 10 ms, then complete it in the transaction
  of the next claim. One durable commit per task is the machine's limit there, below
  the 100 tasks/s that 10 ms tasks would allow.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.common import (
    BENCH_DIR,
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
    preload_cairnq_schema,
    print_table,
    release,
    run_cases,
    save,
    worker_argv,
)
from bench.drain import CAIRNQ_PENDING, Table, sdk_end

CASES = ("unlimited", "limited", "serial", "rate", "raw256", "raw32", "raw_serial")
PROCS = 2
DRAIN_LIMIT = {"wide": {"queues": ["default"], "concurrency": 64}}
SERIAL_LIMIT = {"one": {"queues": ["default"], "concurrency": 1}}
RATE = 200
RATE_LIMIT = {"api": {"queues": ["default"], "rate": f"{RATE}/1s"}}
SERIAL_TASKS = 300


def ours(
    backend: Backend,
    target: str,
    concurrency: int,
    limits: dict[str, Any] | None,
    *,
    sleep_ms: float = 0.0,
    stamp: bool = False,
) -> list[tuple[str, list[str]]]:
    extra = ["--sleep-ms", str(sleep_ms)]
    if limits is not None:
        extra += ["--limits", json.dumps(limits)]
    argv = worker_argv("ours", backend, target, concurrency=concurrency, stamp=stamp, extra=extra)
    return [(f"ours#{i}", argv) for i in range(PROCS)]


async def drain(
    backend: Backend,
    n: int,
    commands: Any,
    timeout_s: float,
) -> Run:
    async with fresh_target(backend, "limits") as target:
        await preload_cairnq_schema(backend, target, n)
        async with Table(backend, target) as table, children(commands(target)) as workers:
            t0 = await release(workers)
            await table.wait_until_zero(CAIRNQ_PENDING, timeout_s)
            end = await sdk_end(table, n)
    elapsed = end - t0
    return Run({"tasks_per_s": n / elapsed, "elapsed_s": elapsed})


async def raw(
    backend: Backend, n: int, timeout_s: float, *, procs: int = PROCS, extra: Sequence[str] = ()
) -> Run:
    """The bare SQL loop of bench/raw_proc.py in `procs` processes: `--batch 256` (the
    drain's limit), or with `extra` its arguments instead."""
    async with fresh_target(backend, "limits") as target:
        await preload_cairnq_schema(backend, target, n)
        argv = [sys.executable, str(BENCH_DIR / "raw_proc.py"), "--backend", backend,
                "--target", target, "--tx", "one", *(extra or ["--batch", "256"])]  # fmt: skip
        async with children([(f"raw#{i}", argv) for i in range(procs)]) as workers:
            t0 = await release(workers)
            await asyncio.gather(*(w.wait_exit(timeout_s) for w in workers))
            end = max(float(w.done["end"]) for w in workers)
    elapsed = end - t0
    return Run({"tasks_per_s": n / elapsed, "elapsed_s": elapsed})


async def rate(backend: Backend, seconds: float) -> Run:
    n = int(RATE * seconds * 1.2) + RATE
    async with fresh_target(backend, "limits") as target:
        await preload_cairnq_schema(backend, target, n)
        commands = ours(backend, target, 32, RATE_LIMIT, stamp=True)
        async with Table(backend, target) as table:
            async with children(commands) as workers:
                await release(workers)
                await asyncio.sleep(seconds + 1.0)
            rows = await table.rows(
                "select result from cairnq_tasks where status = 'succeeded' and result is not null"
            )
    results = [json.loads(r[0]) if isinstance(r[0], str) else r[0] for r in rows]
    starts = sorted(float(result["t"]) for result in results)
    claims = sorted(float(r["claimed"]) for r in results if r.get("claimed") is not None)
    if not starts:
        raise RuntimeError("no task started")
    first = starts[0]
    within = [s for s in starts if s < first + seconds]
    most = max(bisect.bisect_left(within, s + 1.0) - i for i, s in enumerate(within))
    # In whole milliseconds, the clock's own unit: a start counted exactly when a window
    # reopens (at +1000 ms) belongs to the next window, which float seconds can blur.
    counted = [round(c * 1000) for c in claims if c < claims[0] + seconds] if claims else []
    most_claims = max(
        (bisect.bisect_left(counted, c + 1000) - i for i, c in enumerate(counted)), default=0
    )
    # The stamp is the claim's lease, measured from the instant the start was counted
    # (on SQLite a moment after it): a window that much shorter shows whether an excess
    # is that.
    most_claims_short = max(
        (bisect.bisect_left(counted, c + 990) - i for i, c in enumerate(counted)), default=0
    )
    return Run(
        {
            "starts_per_s": len(within) / seconds,
            "most_in_1s": float(most),
            "most_claims_in_1s": float(most_claims),
            "most_claims_in_990ms": float(most_claims_short),
            "of_rate": len(within) / seconds / RATE,
        },
        {"counted_s": seconds},
    )


def report(points: Sequence[Point]) -> None:
    for backend in ("sqlite", "postgres"):
        mine = {p.labels["case"]: p for p in points if p.labels["backend"] == backend}
        if not mine:
            continue
        rows = []
        base = mine.get("unlimited")
        base_rate = base.median("tasks_per_s") if base else None
        raw_rate = mine["raw256"].median("tasks_per_s") if "raw256" in mine else None
        serial_raw = mine.get("raw_serial")
        serial_rate = serial_raw.median("tasks_per_s") if serial_raw else None
        for case in CASES:
            p = mine.get(case)
            if p is None:
                continue
            if case == "rate":
                rows.append(
                    [
                        f"rate {RATE}/1s",
                        f"{fmt(p.median('starts_per_s'), 1)} starts/s",
                        f"{fmt(p.median('of_rate'), 3)} of the rate",
                        f"most in 1 s: {fmt(p.median('most_claims_in_1s'))} claims "
                        f"({fmt(p.median('most_claims_in_990ms'))} in 990 ms), "
                        f"{fmt(p.median('most_in_1s'))} handler starts",
                    ]
                )
                continue
            tps = p.median("tasks_per_s")
            vs_base = "" if not (tps and base_rate) else f"{tps / base_rate:.2f} of unlimited"
            vs_raw = "" if not (tps and raw_rate) else f"{tps / raw_rate:.2f} of raw256"
            shape = mine["raw32"].median("tasks_per_s") if "raw32" in mine else None
            if case == "limited" and shape and raw_rate:
                vs_raw += f" (raw32 ÷ raw256: {shape / raw_rate:.2f})"
            if case == "limited" and base is not None:
                vs_base += round_ratios(p, base)
            if case in ("serial", "raw_serial"):
                vs_base = "" if not tps else f"{tps / 100:.2f} of 100/s"
                vs_raw = "" if not (tps and serial_rate) else f"{tps / serial_rate:.2f} of raw"
            rows.append([case, f"{fmt(tps)} tasks/s", vs_base, vs_raw])
        print_table(f"limits, {backend} (medians)", ["case", "figure", "ratio", "beside"], rows)


def round_ratios(p: Point, base: Point) -> str:
    """The limited drain over the unlimited one, round by round (the cases run in turn, so
    the k-th runs of the two are neighbours), and the median of those: a machine whose
    speed drifts during the bench moves both of one round alike, where the ratio of two
    medians can pair a fast round's unlimited with a slow round's limited."""
    pairs = zip(p.runs, base.runs, strict=False)
    ratios = [r.metrics["tasks_per_s"] / b.metrics["tasks_per_s"] for r, b in pairs]
    if len(ratios) < 2:
        return ""
    each = ", ".join(f"{x:.2f}" for x in ratios)
    return f"; per round {each} (median {statistics.median(ratios):.2f})"


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rate-seconds", type=float, default=60.0)
    parser.add_argument("--case", action="append", choices=CASES, help="repeatable; default all")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", default="limits", help="bench/out/<name>.json")
    args = parser.parse_args(argv)
    cases: list[Case] = []
    for backend in chosen_backends(args):
        for case in args.case or CASES:

            async def once(_: int, case: str = case, b: Backend = backend) -> Run:
                if case == "unlimited":
                    return await drain(b, args.tasks, lambda t: ours(b, t, 32, None), args.timeout)
                if case == "limited":
                    return await drain(
                        b, args.tasks, lambda t: ours(b, t, 32, DRAIN_LIMIT), args.timeout
                    )
                if case == "serial":
                    return await drain(
                        b,
                        SERIAL_TASKS,
                        lambda t: ours(b, t, 4, SERIAL_LIMIT, sleep_ms=10),
                        args.timeout,
                    )
                if case == "rate":
                    return await rate(b, args.rate_seconds)
                if case == "raw_serial":
                    # One task of 10 ms at a time, each handed over with one commit.
                    hold = ["--batch", "1", "--hold-ms", "10"]
                    return await raw(b, SERIAL_TASKS, args.timeout, procs=1, extra=hold)
                if case == "raw32":
                    return await raw(b, args.tasks, args.timeout, extra=["--batch", "32"])
                return await raw(b, args.tasks, args.timeout)

            cases.append(Case({"backend": backend, "case": case}, once))
    config = {k: v for k, v in vars(args).items() if k != "backend"}
    started = time.monotonic()
    points = await run_cases(cases, args.repeats, lambda pts: save(args.out, config, pts))
    report(points)
    print(f"took {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main_entry(main)
