"""Drain throughput: 20,000 pre-loaded no-op tasks, 1 or 2 worker processes.

    python -m bench.drain [--backend sqlite|postgres]... [--impl NAME]... [--procs 1 --procs 2]
                          [--tasks 20000] [--repeats 3] [--prefetch N]...
                          [--tracing off|api|provider]...

Implementations:
- `ours`, `cairnq`: worker processes (`bench/worker_proc.py`, concurrency 8) on rows
  pre-loaded with cairnqd's `submit_many` (same table format for both).
- `raw1`, `raw256`: the bare SQL loop (`bench/raw_proc.py`): claim 1 + complete in one
  transaction per task, or claim 256 + one set-based complete_many in one transaction.
  `raw1-2tx`, `raw256-2tx` (not run by default): the claim and the complete commit
  separately, as a worker's must.
- `huey` (SQLite only): `SqliteHuey` with `fsync=True` (synchronous=FULL, as ours), its
  own consumer with `--concurrency` worker threads, tasks queued through huey itself.
- `procrastinate`, `pgqueuer` (Postgres only): their own workers on jobs pre-loaded with
  their own batch enqueue.

Tracing's cost (`--tracing`, repeatable; ours only, a label of its own): `off`, the
workers import no OpenTelemetry at all; `api`, the API is imported but no provider is
set (the `otel` extra installed, the application not tracing); `provider`, the SDK's
`TracerProvider` with a `BatchSpanProcessor` feeding an exporter that drops everything
(every span is built and batched, nothing is sent). Each run checks from the workers'
`DONE` line that OpenTelemetry was loaded, or not, as asked.

On Postgres the database is ANALYZEd after the preload (`--no-analyze` skips it):
stock autovacuum would do that after a bulk load, but this machine's server runs with
autovacuum off.

Timing: the clock starts just before GO is sent to the (already connected) processes.
It stops at the last completion: `max(completed_at_ms)` from the table for the cairnq
family, the last commit a raw loop reports, or (peers) the first 50 ms poll that finds
nothing pending. Fairness is the per-process task count (worker_id in the table, or
what each process reports it handled). Worker CPU is utime+stime from /proc between GO
and the end, summed over the worker processes (a raw loop reports its own); on
Postgres, "PG CPU" is the same for the server backends connected to the bench
database (the driver's own polling connection excluded; WAL writer and other
background processes not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sqlite3
import sys
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from bench import peers
from bench.common import (
    BENCH_DIR,
    Backend,
    Case,
    Child,
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

SDKS = ("ours", "cairnq")
# name -> (claim batch, transactions per iteration)
RAW = {
    "raw1": (1, "one"),
    "raw256": (256, "one"),
    "raw1-2tx": (1, "two"),
    "raw256-2tx": (256, "two"),
}
IMPLS: dict[Backend, tuple[str, ...]] = {
    "sqlite": ("ours", "cairnq", "raw1", "raw256", "huey"),
    "postgres": ("ours", "cairnq", "raw1", "raw256", "procrastinate", "pgqueuer"),
}
CAIRNQ_PENDING = "select count(*) from cairnq_tasks where status in ('queued', 'running')"
CAIRNQ_SUCCEEDED = "select count(*) from cairnq_tasks where status = 'succeeded'"
# huey deletes a task from its queue table when a worker takes it (and runs a no-op at
# once): the end is the first poll that finds the table empty.
HUEY_PENDING = "select count(*) from task"
POLL_S = 0.05
COLUMNS = [
    "impl",
    "procs",
    "tasks/s",
    "elapsed s",
    "fairness",
    "worker CPU ms/task",
    "PG CPU ms/task",
    "tasks/cycle p50",
    "cycles/1k tasks",
    "load s",
]
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class Table:
    """Counting queries against the database under test, from the driver."""

    def __init__(self, backend: Backend, target: str) -> None:
        self.backend = backend
        self.target = target
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.AsyncConnection[Any] | None = None

    async def __aenter__(self) -> Table:
        if self.backend == "sqlite":
            self._sqlite = sqlite3.connect(self.target, isolation_level=None)
            self._sqlite.execute("pragma busy_timeout = 5000")
        else:
            self._pg = await psycopg.AsyncConnection.connect(self.target, autocommit=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
        if self._pg is not None:
            await self._pg.close()

    async def rows(self, sql: str) -> list[tuple[Any, ...]]:
        if self._sqlite is not None:
            return self._sqlite.execute(sql).fetchall()
        assert self._pg is not None
        cursor = await self._pg.execute(sql)
        return await cursor.fetchall()

    async def scalar(self, sql: str) -> Any:
        return (await self.rows(sql))[0][0]

    async def backend_cpu(self) -> dict[int, float]:
        """CPU seconds of every Postgres backend connected to this database (workers,
        their pools and listeners), except the driver's own; the server runs here."""
        if self._pg is None:
            return {}
        rows = await self.rows(
            "select pid from pg_stat_activity "
            "where datname = current_database() and pid <> pg_backend_pid()"
        )
        usage: dict[int, float] = {}
        for (pid,) in rows:
            try:
                usage[int(pid)] = cpu_seconds(int(pid))
            except OSError:
                continue  # gone since the query
        return usage

    async def wait_until_zero(self, sql: str, timeout_s: float) -> float:
        """Poll every 50 ms until `sql` counts 0; returns the time of that poll."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = await self.scalar(sql)
            now = time.time()
            if remaining == 0:
                return now
            if time.monotonic() > deadline:
                raise TimeoutError(f"{remaining} tasks still pending after {timeout_s:.0f} s")
            await asyncio.sleep(POLL_S)


def commands(
    impl: str,
    backend: Backend,
    target: str,
    procs: int,
    args: argparse.Namespace,
    prefetch: int | str | None = None,
    tracing: str | None = None,
) -> list[tuple[str, list[str]]]:
    if impl in RAW:
        argv = [sys.executable, str(BENCH_DIR / "raw_proc.py"), "--backend", backend,
                "--target", target, "--batch", str(RAW[impl][0]), "--tx", RAW[impl][1]]  # fmt: skip
    else:
        extra: list[str] = []
        if impl == "pgqueuer":
            extra = ["--pgq-batch", str(args.pgq_batch)]
        if tracing is not None:
            extra = ["--tracing", tracing]
        argv = worker_argv(
            impl,
            backend,
            target,
            concurrency=args.concurrency,
            prefetch=prefetch,
            extra=extra,
        )
    return [(f"{impl}#{i}", argv) for i in range(procs)]


async def drain_once(
    backend: Backend,
    impl: str,
    procs: int,
    args: argparse.Namespace,
    prefetch: int | str | None = None,
    tracing: str | None = None,
) -> Run:
    n = args.tasks
    split: list[int] = []
    cycles: list[int] = []
    async with fresh_target(backend, "drain") as target:
        if impl in peers.PEERS:
            load_s = await peers.preload(impl, target, n)
        elif impl == "huey":
            load_s = await preload_huey(target, n)
        else:
            load_s = await preload_cairnq_schema(backend, target, n)
        if backend == "postgres" and args.analyze:
            await analyze(target)
        async with (
            Table(backend, target) as table,
            children(commands(impl, backend, target, procs, args, prefetch, tracing)) as workers,
        ):
            cpu0 = {w.pid: cpu_seconds(w.pid) for w in workers}
            db_cpu0 = await table.backend_cpu()
            t0 = await release(workers)
            if impl in RAW:
                await asyncio.gather(*(w.wait_exit(args.timeout) for w in workers))
                cpu = sum(float(w.done["cpu"]) for w in workers)
                end = max(float(w.done["end"]) for w in workers)
                split = [int(w.done["handled"]) for w in workers]
            else:
                pending_sql = (
                    HUEY_PENDING if impl == "huey" else peers.PENDING_SQL.get(impl, CAIRNQ_PENDING)
                )
                polled_end = await table.wait_until_zero(pending_sql, args.timeout)
                cpu = sum(cpu_seconds(w.pid) - cpu0[w.pid] for w in workers)
                if impl in SDKS:
                    end = await sdk_end(table, n)
                    split = await sdk_split(table, workers)
                    cycles = await sdk_cycles(table)
                else:
                    end = polled_end
                    split = []
            if impl in SDKS or impl in RAW:
                # A drain counts only if it settled what it took: a raw loop whose
                # complete matched no row once measured claims alone (bench/RESULTS.md,
                # "Method").
                succeeded = await table.scalar(CAIRNQ_SUCCEEDED)
                if succeeded != n:
                    raise RuntimeError(f"{impl}: {succeeded} of {n} tasks succeeded")
            if impl in RAW:  # their backends have exited; each loop measured its own
                db_cpu = sum(float(w.done.get("dbcpu", 0)) for w in workers)
            else:
                db_cpu1 = await table.backend_cpu()
                db_cpu = sum(v - db_cpu0.get(pid, 0.0) for pid, v in db_cpu1.items())
        if impl in peers.PEERS or impl == "huey":
            split = [int(w.done.get("handled", 0)) for w in workers]
    if tracing is not None:
        check_tracing(tracing, workers)
    elapsed = end - t0
    metrics = {"tasks_per_s": n / elapsed, "elapsed_s": elapsed, "load_s": load_s}
    if cpu:
        metrics["worker_cpu_ms_per_task"] = cpu * 1000 / n
    if db_cpu:
        metrics["db_cpu_ms_per_task"] = db_cpu * 1000 / n
    counted: int = sum(split, 0)
    if procs > 1 and counted:
        metrics["min_share"] = min(split) / counted
    detail: dict[str, Any] = {"split": split, "processes": [w.ident for w in workers]}
    if cycles:
        # The batch size the median task was settled in, and the cycles per task.
        weighted = sorted(size for size in cycles for _ in range(size))
        metrics["cycle_tasks_p50"] = weighted[len(weighted) // 2]
        metrics["cycles_per_1k_tasks"] = 1000 * len(cycles) / max(1, sum(cycles))
        detail["cycle_histogram"] = cycle_histogram(cycles)
    return Run(metrics, detail)


def check_tracing(tracing: str, workers: Sequence[Child]) -> None:
    """A run counts only if its workers held OpenTelemetry as `tracing` asked."""
    wanted = "0" if tracing == "off" else "1"
    for w in workers:
        if w.done.get("otel") != wanted:
            raise RuntimeError(
                f"--tracing {tracing}: {w.ident} said otel={w.done.get('otel')}, not {wanted}"
            )


async def preload_huey(path: str, n: int) -> float:
    """Queue `n` huey tasks through huey itself (in a process of its own, which names
    the task the way the consumers do); seconds spent."""
    start = time.perf_counter()
    argv = [*worker_argv("huey", "sqlite", path, concurrency=1, prefetch=None, extra=[]),
            "--huey-preload", str(n)]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(*argv)
    if await proc.wait() != 0:
        raise RuntimeError(f"huey preload exited {proc.returncode}")
    return time.perf_counter() - start


async def analyze(dsn: str) -> None:
    """What stock autovacuum would soon do after a bulk load: this CI server runs with
    autovacuum off, and without statistics some plans (procrastinate's fetch, 8x
    slower) go badly wrong."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("analyze")


async def sdk_end(table: Table, n: int) -> float:
    done, last_ms = (
        await table.rows(
            "select count(*), max(completed_at_ms) from cairnq_tasks where status = 'succeeded'"
        )
    )[0]
    if done != n:
        raise RuntimeError(f"only {done} of {n} tasks succeeded")
    return int(last_ms) / 1000


# Buckets of the per-cycle histogram: tasks settled by one claim transaction.
CYCLE_BUCKETS = (1, 8, 32, 128, 512)


async def sdk_cycles(table: Table) -> list[int]:
    """Tasks each claim transaction settled. Results ride in the next claim, and every
    row one transaction completes gets the same `completed_at_ms` (Postgres `now()` is
    the transaction's start; SQLite binds the time once per statement), so grouping
    by worker and completion time recovers the batches `prefetch` reached."""
    rows = await table.rows(
        "select count(*) from cairnq_tasks where status = 'succeeded' "
        "group by worker_id, completed_at_ms"
    )
    return sorted(int(r[0]) for r in rows)


def cycle_histogram(sizes: Sequence[int]) -> dict[str, int]:
    """Tasks (not cycles) by the size of the cycle that settled them."""
    edges = [*CYCLE_BUCKETS, None]
    labels = [
        f"{lo}" if hi == lo + 1 else (f"{lo}-{hi - 1}" if hi is not None else f"{lo}+")
        for lo, hi in itertools.pairwise(edges)
        if lo is not None
    ]
    counts = dict.fromkeys(labels, 0)
    for size in sizes:
        index = sum(1 for edge in CYCLE_BUCKETS if size >= edge) - 1
        counts[labels[index]] += size
    return counts


async def sdk_split(table: Table, workers: Sequence[Child]) -> list[int]:
    counts = dict(
        await table.rows(
            "select worker_id, count(*) from cairnq_tasks where status = 'succeeded' "
            "group by worker_id"
        )
    )
    return [int(counts.get(w.ident, 0)) for w in workers]


def prefetch_arg(text: str) -> int | str:
    """`--prefetch auto` or a count."""
    return text if text == "auto" else int(text)


def report(points: Sequence[Point]) -> None:
    for backend in ("sqlite", "postgres"):
        rows = []
        for p in points:
            if p.labels["backend"] != backend:
                continue
            split = ""
            if p.labels["procs"] > 1:
                share = p.median("min_share")
                split = "-" if share is None else f"{share * 100:.0f}% min"
            name = p.labels["impl"]
            if p.labels.get("prefetch") is not None:
                name += f" (prefetch {p.labels['prefetch']})"
            if p.labels.get("tracing") is not None:
                name += f" (tracing {p.labels['tracing']})"
            rows.append(
                [
                    name,
                    str(p.labels["procs"]),
                    fmt(p.median("tasks_per_s")),
                    fmt(p.median("elapsed_s"), 2),
                    split,
                    fmt(p.median("worker_cpu_ms_per_task"), 3),
                    fmt(p.median("db_cpu_ms_per_task"), 3),
                    fmt(p.median("cycle_tasks_p50"), 0),
                    fmt(p.median("cycles_per_1k_tasks"), 1),
                    fmt(p.median("load_s"), 2),
                ]
            )
        if rows:
            print_table(
                f"drain, {backend} (median of runs)",
                COLUMNS,
                rows,
            )
        for p in points:
            last = p.runs[-1].detail.get("cycle_histogram") if p.runs else None
            if p.labels["backend"] == backend and last:
                shown = ", ".join(f"{size}: {tasks}" for size, tasks in last.items())
                print(f"{p.labels['impl']} x{p.labels['procs']} tasks by claim-cycle size: {shown}")
        tracing_ratios(points, backend)
        by_key = {
            (p.labels["impl"], p.labels["procs"]): p
            for p in points
            if p.labels["backend"] == backend
            and p.labels.get("prefetch") in (None, "auto")
            and p.labels.get("tracing") in (None, "off")
        }
        for procs in (1, 2):
            ours, theirs = by_key.get(("ours", procs)), by_key.get(("cairnq", procs))
            if ours and theirs:
                a, b = ours.median("tasks_per_s"), theirs.median("tasks_per_s")
                if a and b:
                    print(f"{backend}, {procs} proc: ours/cairnq = {a / b:.2f}x")


def tracing_ratios(points: Sequence[Point], backend: str) -> None:
    """Each tracing mode against `off`: throughput and worker CPU per task."""
    by_mode = {
        (p.labels["procs"], p.labels["tracing"]): p
        for p in points
        if p.labels["backend"] == backend and p.labels.get("tracing") is not None
    }
    for (procs, mode), point in sorted(by_mode.items()):
        base = by_mode.get((procs, "off"))
        if mode == "off" or base is None:
            continue
        shown = []
        for key, label in (("tasks_per_s", "tasks/s"), ("worker_cpu_ms_per_task", "CPU/task")):
            a, b = point.median(key), base.median(key)
            if a and b:
                shown.append(f"{label} {a / b:.3f}x")
        if shown:
            print(f"{backend}, {procs} proc: tracing {mode} / off: {', '.join(shown)}")


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--impl", action="append", help="repeatable; default: all")
    parser.add_argument("--procs", action="append", type=int, help="repeatable; default 1 2")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--prefetch",
        action="append",
        type=prefetch_arg,
        help="repeatable; ours only: Worker(prefetch=N or auto). Without it ours runs with "
        "its default (auto); 0 claims only free slots, like the public SDK",
    )
    parser.add_argument(
        "--tracing",
        action="append",
        choices=("off", "api", "provider"),
        help="repeatable; ours only: no OpenTelemetry, its API without a provider, or an "
        "SDK provider with a batch processor and an exporter that drops everything",
    )
    parser.add_argument("--pgq-batch", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--no-analyze",
        dest="analyze",
        action="store_false",
        help="Postgres: skip the ANALYZE after preloading",
    )
    parser.add_argument("--out", default="drain", help="bench/out/<name>.json")
    args = parser.parse_args(argv)
    cases: list[Case] = []
    for backend in chosen_backends(args):
        for impl in args.impl or IMPLS[backend]:
            if impl not in IMPLS[backend] and impl not in RAW:
                continue
            if (impl in peers.PEERS or impl == "huey") and not peers.available(impl):
                print(f"skip {impl}: not installed")
                continue
            prefetches: list[int | str | None] = [None]
            if impl == "ours" and args.prefetch:
                prefetches = list(args.prefetch)
            tracings: list[str | None] = [None]
            if impl == "ours" and args.tracing:
                tracings = list(dict.fromkeys(args.tracing))
            for procs in args.procs or (1, 2):
                for prefetch, tracing in itertools.product(prefetches, tracings):
                    labels: dict[str, object] = {"backend": backend, "impl": impl, "procs": procs}
                    if prefetch is not None:
                        labels["prefetch"] = prefetch
                    if tracing is not None:
                        labels["tracing"] = tracing

                    async def once(
                        run: int,
                        impl: str = impl,
                        procs: int = procs,
                        b: Backend = backend,
                        prefetch: int | str | None = prefetch,
                        tracing: str | None = tracing,
                    ) -> Run:
                        return await drain_once(b, impl, procs, args, prefetch, tracing)

                    cases.append(Case(labels, once))
    config = {k: v for k, v in vars(args).items() if k != "backend"}
    points = await run_cases(cases, args.repeats, lambda pts: save(args.out, config, pts))
    report(points)


if __name__ == "__main__":
    main_entry(main)
