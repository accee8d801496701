"""Idle cost: the CPU a daemon with nothing to do spends, beside its wake-up latency.

    python -m bench.idle [--backend sqlite|postgres]... [--window 20] [--tasks 60]
                         [--repeats 3]

Per backend and round, on a fresh database: `cairnqd` with two groups (queues `a` and
`b`) of two children each, and one bare `Worker.serve()` process (queue `default`),
all with the default poll interval. Once every child is ready and a settling second has
passed, nothing is submitted for `--window` seconds; each process's user + system CPU
over the window (/proc/PID/stat) is its idle cost, in percent of one core. Then the
same processes, still idle between tasks, get `--tasks` tasks one at a time on queue
`a` (a random 20-60 ms apart, after 5 warm-up tasks): pickup is the handler's start
minus the moment the submit returned (bench.daemon_handlers `bench.stamp`), as
bench.latency measures it for one worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import yaml

from bench.common import (
    Backend,
    Case,
    Point,
    Run,
    add_common_args,
    chosen_backends,
    fmt,
    main_entry,
    percentile,
    print_table,
    run_cases,
    save,
    wait_for_quiet,
)
from bench.daemon import (
    ENV,
    Database,
    children_of,
    cpu_seconds,
    daemon_config,
    helper,
    preload,
    process_title,
    wait_for,
)
from cairnqd import CairnQ

GROUPS = {"one": ["a"], "two": ["b"]}
CHILDREN_PER_GROUP = 2
WARMUP = 5


def start_daemon(db: Database, tmp: Path) -> subprocess.Popen[bytes]:
    run_dir = tmp / f"run-{uuid.uuid4().hex[:8]}"
    run_dir.mkdir()
    config = tmp / f"idle-{uuid.uuid4().hex[:6]}.yaml"
    groups = {
        name: {"queues": queues, "processes": CHILDREN_PER_GROUP, "concurrency": 4}
        for name, queues in GROUPS.items()
    }
    config.write_text(yaml.safe_dump(daemon_config(db.target, run_dir, groups)))
    log = tmp / "daemon.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cairnqd.cli", "-c", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=ENV,
        )
    return proc


def client_for(db: Database) -> CairnQ:
    if db.backend == "sqlite":
        return CairnQ.sqlite(db.path)
    return CairnQ.postgres(db.dsn)


async def pickups(db: Database, n: int, seed: int) -> list[float]:
    """`n` tasks on queue `a`, one at a time: handler start minus submit return, ms."""
    rng = random.Random(seed)
    out: list[float] = []
    async with client_for(db) as client:
        for i in range(n + WARMUP):
            await asyncio.sleep(rng.uniform(0.020, 0.060))
            task = await client.submit("bench.stamp", {"i": i}, queue="a")
            submitted = time.time()
            done = await client.wait(task.id, timeout_ms=10_000, poll_ms=2, max_poll_ms=10)
            if done.status != "succeeded" or not isinstance(done.result, dict):
                raise RuntimeError(f"task {task.id} ended {done.status}: {done.error}")
            if i >= WARMUP:
                out.append((float(done.result["t"]) - submitted) * 1000)
    return out


def start(db: Database, tmp: Path) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """The schema (the bare worker does not migrate), then the daemon and the bare
    worker; back once every child of the daemon is ready."""
    preload(db, 0)
    daemon = start_daemon(db, tmp)
    bare = subprocess.Popen(helper("worker", json.dumps(db.target)), env=ENV)
    want = len(GROUPS) * CHILDREN_PER_GROUP

    def ready() -> bool:
        titles = [process_title(p) for p in children_of(daemon.pid)]
        return sum(1 for t in titles if t.endswith(" ready")) == want

    wait_for("daemon children ready", ready, timeout=60, every=0.1)
    return daemon, bare


def stop(*procs: subprocess.Popen[bytes] | None) -> None:
    for proc in procs:
        if proc is not None:
            proc.terminate()
    for proc in procs:
        if proc is not None:
            proc.wait(60)


async def idle_once(backend: Backend, args: argparse.Namespace, round_: int) -> Run:
    with tempfile.TemporaryDirectory(prefix="idle-") as scratch:
        tmp = Path(scratch)
        db = Database(backend, args.dsn, tmp)
        daemon = bare = None
        try:
            daemon, bare = await asyncio.to_thread(start, db, tmp)
            await asyncio.sleep(args.settle)
            await wait_for_quiet()
            pids = {"parent": daemon.pid, "bare": bare.pid} | {
                f"child{i}": pid for i, pid in enumerate(sorted(children_of(daemon.pid)))
            }
            before = {k: cpu_seconds(p) for k, p in pids.items()}
            await asyncio.sleep(args.window)
            after = {k: cpu_seconds(p) for k, p in pids.items()}
            pct = {k: 100 * (after[k] - before[k]) / args.window for k in pids}
            children = [v for k, v in pct.items() if k.startswith("child")]
            latencies = await pickups(db, args.tasks, seed=round_)
        finally:
            await asyncio.to_thread(stop, daemon, bare)
            db.drop()
    if daemon is not None and daemon.returncode not in (0, -15):
        raise RuntimeError(f"the daemon exited {daemon.returncode}: see {tmp / 'daemon.log'}")
    return Run(
        {
            "parent_pct": pct["parent"],
            "child_pct_max": max(children),
            "child_pct_mean": statistics.fmean(children),
            "bare_pct": pct["bare"],
            "pickup_p50_ms": percentile(latencies, 50),
            "pickup_p99_ms": percentile(latencies, 99),
        },
        {"cpu_pct": pct, "pickups_ms": latencies},
    )


def report(points: Sequence[Point]) -> None:
    rows = []
    for p in points:
        rows.append(
            [
                p.labels["backend"],
                fmt(p.median("child_pct_mean"), 2),
                fmt(p.median("child_pct_max"), 2),
                fmt(p.median("parent_pct"), 2),
                fmt(p.median("bare_pct"), 2),
                fmt(p.median("pickup_p50_ms"), 1),
                fmt(p.median("pickup_p99_ms"), 1),
            ]
        )
    print_table(
        "idle cost (medians; CPU in % of one core)",
        ["backend", "child", "child (max)", "parent", "bare worker", "pickup p50", "p99"],
        rows,
    )


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of idling measured")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds before the window")
    parser.add_argument("--tasks", type=int, default=60, help="tasks timed for pickup")
    parser.add_argument("--out", default="idle", help="bench/out/<name>.json")
    args = parser.parse_args(argv)
    cases: list[Case] = []
    for backend in chosen_backends(args):

        async def once(round_: int, b: Backend = backend) -> Run:
            return await idle_once(b, args, round_)

        cases.append(Case({"backend": backend}, once))
    config = {k: v for k, v in vars(args).items() if k != "backend"}
    points = await run_cases(cases, args.repeats, lambda pts: save(args.out, config, pts))
    report(points)


if __name__ == "__main__":
    main_entry(main)
