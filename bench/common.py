"""Shared harness: fresh databases, medians, tables, JSON output, worker processes.

Every data point runs on a database created for it (a new SQLite file in a new temp
dir, or a new Postgres database `bench_<label>_<hex>` dropped afterwards), so one
point's leftovers never shape the next one's plans. Worker processes are separate
interpreters (`bench/worker_proc.py`, `bench/raw_proc.py`) speaking a tiny line
protocol on stdout/stdin:

    child -> "READY <worker-id>"   connected, migrations done, not yet claiming
    driver -> "GO"                 start working (all children are released together)
    child -> "DONE <key>=<value> ..." on the way out, after SIGTERM or a finished loop
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import psycopg

Backend = Literal["sqlite", "postgres"]
BACKENDS: tuple[Backend, ...] = ("sqlite", "postgres")

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
OUT_DIR = BENCH_DIR / "out"
PG_ADMIN_DSN = os.environ.get("BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")

QUEUE = "default"
NOOP = "bench.noop"
UNCLAIMED = "bench.unclaimed"
DEFAULT_REPEATS = 3

Metrics = dict[str, float]


# -- fresh databases --------------------------------------------------------------------


def pg_dsn(dbname: str) -> str:
    """The admin DSN pointed at `dbname`, as a URL: asyncpg (the public SDK, pgqueuer)
    accepts only the URL form."""
    parts = urlsplit(PG_ADMIN_DSN)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"BENCH_PG_DSN must be a postgresql:// URL, got {PG_ADMIN_DSN!r}")
    return urlunsplit(parts._replace(path=f"/{dbname}"))


def _pg_admin(sql: str) -> None:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)


@contextlib.asynccontextmanager
async def fresh_target(backend: Backend, label: str) -> AsyncIterator[str]:
    """A SQLite file path or a Postgres DSN nobody has used yet; removed on exit."""
    if backend == "sqlite":
        folder = await asyncio.to_thread(tempfile.mkdtemp, prefix=f"bench_{label}_")
        try:
            yield str(Path(folder) / "queue.db")
        finally:
            await asyncio.to_thread(shutil.rmtree, folder, True)
        return
    name = f"bench_{label}_{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(_pg_admin, f'create database "{name}"')
    try:
        yield pg_dsn(name)
    finally:
        await asyncio.to_thread(_pg_admin, f'drop database if exists "{name}" with (force)')


# -- medians and percentiles ------------------------------------------------------------


@dataclass
class Run:
    """One measured run: numbers to take medians of, plus anything worth keeping."""

    metrics: Metrics
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Point:
    """One data point: its identifying labels and its repeated runs."""

    labels: dict[str, Any]
    runs: list[Run]

    def median(self, key: str) -> float | None:
        values = [r.metrics[key] for r in self.runs if key in r.metrics]
        return statistics.median(values) if values else None

    def as_json(self) -> dict[str, Any]:
        keys = dict.fromkeys(k for r in self.runs for k in r.metrics)
        return {
            **self.labels,
            "median": {k: self.median(k) for k in keys},
            "runs": [{"metrics": r.metrics, "detail": r.detail} for r in self.runs],
        }


@dataclass
class Case:
    """One data point to measure: its labels and how to run it once (given the round)."""

    labels: dict[str, Any]
    once: Callable[[int], Awaitable[Run]]


async def run_cases(
    cases: Sequence[Case],
    repeats: int,
    checkpoint: Callable[[list[Point]], Awaitable[Any]] | None = None,
) -> list[Point]:
    """Measure every case `repeats` times, round-robin: round r runs each case once.

    Interleaving spreads any background load (a shared machine) over all cases alike,
    so the ratios between them stay fair even when absolute figures drift. Each run
    builds its own fresh database. `checkpoint` gets the points after every round
    (to save partial results).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    points = [Point(case.labels, []) for case in cases]
    for r in range(repeats):
        for case, point in zip(cases, points, strict=True):
            busy_before = await wait_for_quiet()
            try:
                run = await case.once(r)
            except (TimeoutError, RuntimeError) as exc:
                # One broken run (a peer stalls, a worker dies) must not sink the suite.
                print(f"  [{_label_text(case.labels)}] run {r + 1}/{repeats} FAILED: {exc}")
                run = Run({}, {"error": f"{type(exc).__name__}: {exc}"})
            run.detail["machine_busy_before"] = round(busy_before, 3)
            # The tree may be edited while a long suite runs; know which code ran.
            run.detail["cairnqd_tree_sha256"] = await asyncio.to_thread(source_digest)
            point.runs.append(run)
            shown = ", ".join(f"{k}={_short(v)}" for k, v in run.metrics.items())
            print(f"  [{_label_text(case.labels)}] run {r + 1}/{repeats}: {shown}", flush=True)
        if checkpoint is not None:
            await checkpoint(points)
    return points


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs, from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])
    return total - idle, total


def busy_cpu_s() -> float:
    """CPU seconds every CPU has spent busy since boot, whoever used them."""
    return _cpu_jiffies()[0] / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pids: Iterable[int]) -> float:
    """CPU seconds (user + system) the processes `pids` have used; one that is gone
    counts nothing."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


async def machine_busy(window_s: float = 1.0) -> float:
    """Fraction of all CPUs busy over `window_s` (0..1), whoever is using them."""
    busy0, total0 = _cpu_jiffies()
    await asyncio.sleep(window_s)
    busy1, total1 = _cpu_jiffies()
    return (busy1 - busy0) / max(1, total1 - total0)


async def wait_for_quiet() -> float:
    """Wait (up to BENCH_QUIET_WAIT_S, default 180) until the machine is at most
    BENCH_QUIET_BUSY (default 0.25) busy, so another job's load does not land in a
    measurement. Returns the last reading; proceeds anyway, with a warning, at the limit.
    """
    limit = float(os.environ.get("BENCH_QUIET_BUSY", "0.25"))
    deadline = time.monotonic() + float(os.environ.get("BENCH_QUIET_WAIT_S", "180"))
    while True:
        busy = await machine_busy()
        if busy <= limit:
            return busy
        if time.monotonic() > deadline:
            print(f"  warning: machine still {busy:.0%} busy; measuring anyway", flush=True)
            return busy
        print(f"  machine {busy:.0%} busy (others' load); waiting", flush=True)
        await asyncio.sleep(4.0)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _short(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _label_text(labels: dict[str, Any]) -> str:
    return " ".join(str(v) for v in labels.values())


# -- output -----------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    body = [list(map(str, r)) for r in rows]
    widths = [len(c) for c in columns]
    for row in body:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    print(f"\n### {title}\n")
    print("| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in body:
        cells = [
            cell.rjust(w) if _looks_numeric(cell) else cell.ljust(w)
            for cell, w in zip(row, widths, strict=True)
        ]
        print("| " + " | ".join(cells) + " |")
    print(flush=True)


def _looks_numeric(cell: str) -> bool:
    return bool(cell) and (cell[0].isdigit() or cell[0] in "+-")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=False
        )
    except OSError:
        return ""
    return out.stdout.strip()


def source_digest() -> str:
    """A digest of cairnqd/ and protocol/ as they are on disk (the tree may be dirty)."""
    digest = hashlib.sha256()
    for folder in ("cairnqd", "protocol"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(REPO)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def machine_info() -> dict[str, Any]:
    mem_kb = 0
    with contextlib.suppress(OSError), open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    pg_version = None
    with contextlib.suppress(psycopg.Error), psycopg.connect(PG_ADMIN_DSN) as conn:
        row = conn.execute("show server_version").fetchone()
        pg_version = row[0] if row else None
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "mem_total_gib": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "postgres": pg_version,
        "cairnqd_commit": _git("rev-parse", "--short", "HEAD"),
        "cairnqd_dirty": bool(_git("status", "--porcelain", "--", "cairnqd", "protocol")),
        "cairnqd_tree_sha256": source_digest(),
        "versions": {
            d: _version(d)
            for d in ("cairnq", "cairnqd", "psycopg", "asyncpg", "procrastinate", "pgqueuer")
        },
    }


async def save(name: str, config: dict[str, Any], points: Sequence[Point]) -> Path:
    payload = {
        "bench": name,
        "machine": await asyncio.to_thread(machine_info),
        "config": config,
        "points": [p.as_json() for p in points],
    }
    OUT_DIR.mkdir(exist_ok=True)
    path = OUT_DIR / f"{name}.json"
    text = json.dumps(payload, indent=2, default=str)
    await asyncio.to_thread(path.write_text, text + "\n", "utf-8")
    # An absolute --out lands outside the repository: print it whole then.
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    print(f"wrote {shown}", flush=True)
    return path


# -- child processes --------------------------------------------------------------------


class ChildFailed(RuntimeError):
    pass


@dataclass
class Child:
    """A worker process started by the driver."""

    name: str
    process: asyncio.subprocess.Process
    ident: str = ""
    done: dict[str, str] = field(default_factory=dict)
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=40))
    _stderr_reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def failure(self, what: str) -> ChildFailed:
        tail = "".join(self.stderr_tail).rstrip()
        return ChildFailed(f"{self.name} (pid {self.pid}) {what}\n--- stderr tail ---\n{tail}")

    async def _drain_stderr(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        while line := await stream.readline():
            self.stderr_tail.append(line.decode(errors="replace"))

    async def wait_ready(self, timeout_s: float) -> None:
        stream = self.process.stdout
        assert stream is not None
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self.failure(f"did not print READY within {timeout_s:.0f} s")
            try:
                line = await asyncio.wait_for(stream.readline(), remaining)
            except TimeoutError:
                continue
            if not line:
                await self.process.wait()
                raise self.failure(f"exited with {self.process.returncode} before READY")
            text = line.decode(errors="replace").strip()
            if text.startswith("READY"):
                self.ident = text.partition(" ")[2]
                return

    async def go(self) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(b"GO\n")
        await stdin.drain()

    async def wait_exit(self, timeout_s: float) -> None:
        """Wait for a child that ends on its own (a raw loop) and collect DONE."""
        try:
            await asyncio.wait_for(self.process.wait(), timeout_s)
        except TimeoutError:
            raise self.failure(f"still running after {timeout_s:.0f} s") from None
        await self._collect_done()

    async def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM, wait for a clean exit, SIGKILL if it does not come."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()
        await self._collect_done()
        if self._stderr_reader is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._stderr_reader, 2)

    async def _collect_done(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        rest = await stream.read()
        for line in rest.decode(errors="replace").splitlines():
            if line.startswith("DONE"):
                for pair in line.split()[1:]:
                    key, _, value = pair.partition("=")
                    self.done[key] = value


async def start_child(name: str, argv: Sequence[str]) -> Child:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    child = Child(name, process)
    child._stderr_reader = asyncio.create_task(child._drain_stderr())
    return child


@contextlib.asynccontextmanager
async def children(
    commands: Sequence[tuple[str, Sequence[str]]], ready_timeout_s: float = 60.0
) -> AsyncIterator[list[Child]]:
    """Start every command, wait for all READY lines, yield; always stop them after."""
    started: list[Child] = []
    try:
        for name, argv in commands:
            started.append(await start_child(name, argv))
        for child in started:
            await child.wait_ready(ready_timeout_s)
        yield started
    finally:
        await asyncio.gather(*(c.stop() for c in started), return_exceptions=True)


async def release(started: Sequence[Child]) -> float:
    """Send GO to every child; returns the wall-clock time just before the first GO."""
    t0 = time.time()
    await asyncio.gather(*(c.go() for c in started))
    return t0


def worker_argv(
    impl: str,
    backend: Backend,
    target: str,
    *,
    concurrency: int = 8,
    poll_interval_ms: int | None = None,
    prefetch: int | str | None = None,
    stamp: bool = False,
    stamp_file: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    argv = [
        sys.executable,
        str(BENCH_DIR / "worker_proc.py"),
        "--impl",
        impl,
        "--backend",
        backend,
        "--target",
        target,
        "--concurrency",
        str(concurrency),
    ]
    if poll_interval_ms is not None:
        argv += ["--poll-interval-ms", str(poll_interval_ms)]
    if prefetch is not None:
        argv += ["--prefetch", str(prefetch)]
    if stamp:
        argv.append("--stamp")
    if stamp_file is not None:
        argv += ["--stamp-file", stamp_file]
    return [*argv, *extra]


def read_rss_kib(pid: int) -> int:
    """VmRSS of a live process, in KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


# -- preloading -------------------------------------------------------------------------


def ours_client(backend: Backend, target: str) -> Any:
    """A cairnqd `CairnQ` for the target (not yet connected; use `async with`)."""
    import cairnqd

    if backend == "sqlite":
        return cairnqd.CairnQ.sqlite(target)
    return cairnqd.CairnQ.postgres(target)


async def preload_cairnq_schema(backend: Backend, target: str, n: int, chunk: int = 1000) -> float:
    """Insert `n` queued `bench.noop` tasks with cairnqd's `submit_many`; returns seconds.

    The rows are the protocol's table format, so the public SDK's workers (and the raw
    loops) drain exactly the same rows.
    """
    async with ours_client(backend, target) as client:
        start = time.perf_counter()
        for offset in range(0, n, chunk):
            size = min(chunk, n - offset)
            await client.submit_many(
                [{"name": NOOP, "payload": {"i": offset + i}} for i in range(size)]
            )
        return time.perf_counter() - start


def add_common_args(parser: Any, *, default_backends: Sequence[str] = BACKENDS) -> None:
    parser.add_argument(
        "--backend",
        action="append",
        choices=BACKENDS,
        help=f"repeatable; default: {' '.join(default_backends)}",
    )
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)


def chosen_backends(args: Any, default: Sequence[Backend] = BACKENDS) -> list[Backend]:
    return list(args.backend or default)


def interrupt_on_sigterm() -> None:
    """Handle SIGTERM like Ctrl-C, so that `finally` blocks still stop the processes a
    bench started and drop its databases (a killed bench left them running)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def main_entry(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """`asyncio.run(main())`, with SIGTERM handled like Ctrl-C (`interrupt_on_sigterm`)."""
    interrupt_on_sigterm()
    asyncio.run(main())


def logging_handlers(log_var: str, line: str, imports: str = "") -> str:
    """The source of a handler module whose one task, `probe.run`, appends `line` (an
    f-string body over `ctx`, `os` and `imports`) to the file named by the environment
    variable `log_var`, with one O_APPEND write: the probes count executions from it,
    and the counting itself can lose or double nothing."""
    return f"""
import os
{imports}
from cairnqd.registry import TaskRegistry

registry = TaskRegistry()
LOG = os.environ["{log_var}"]


@registry.task("probe.run")
async def run(ctx, payload):
    line = f"{line}\\n"
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return {{"ok": True}}
"""
