"""The dashboard's server time per page on a big database, and the overview's database
cost against the number of browsers watching.

1. Loads N tasks (default 1,000,000) straight into a fresh database (SQLite file or
   Postgres): 7 days of history over 8 queues and 20 task names, ~85% succeeded, 8%
   failed (5 error types), 4% canceled, 3% queued, a few running; then ANALYZE. And
   the per-queue counters busy workers leave: every period each width keeps (2 hours
   of minutes, 2 days of quarter hours, 8 days of hours), 28 bins per queue.
2. Serves the dashboard in this process (`DashboardServer`, loopback, no login) and
   requests each page `--views` times, one at a time. The server time is measured around
   the request's handling (routing, database reads, rendering), as the server records it;
   the client's wall time is shown beside it.
   - the overview as browsers get it (the shared snapshot, renewed in the background),
     and the overview waiting for a fresh snapshot read (the database's cost of one
     read, paid once per refresh interval however many browsers watch);
   - the task list: first page of each sort, common filters, 30 pages deep by Next
     links, and a page whose cursor sits 90% of the way down;
   - a task's own page;
   - the Charts page over an hour and a week as browsers get it (read when the
     dashboard starts, renewed in the background every 5 s), and over an hour, a day
     and a week read afresh (the database's cost of one renewal, which no browser
     waits for).
3. Browsers: B threads each poll the overview every 250 ms for `--watch` seconds with
   `dashboard.refresh` at 1 s; the snapshot reads per second should stay ~1 whatever B.

    python -m bench.dashboard --backend sqlite
    python -m bench.dashboard --backend postgres --tasks 1000000
    python -m bench.dashboard --backend sqlite --tasks 20000 --views 5 --watch 2   # smoke

The target: median server time per page <= 100 ms on 1,000,000 tasks.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import random
import re
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    BACKENDS,
    Backend,
    fmt,
    fresh_target,
    main_entry,
    percentile,
    print_table,
)
from cairnqd.config import load_config
from cairnqd.dashboard import DashboardData, DashboardServer
from cairnqd.dashboard.params import encode_cursor
from cairnqd.queue_counts import KEEP_MS, OUTCOMES, WAIT, WIDTHS_S, CountRow
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore

TARGET_MS = 100.0
DAY_MS = 86_400_000
QUEUES = [f"q{i}" for i in range(8)]
NAMES = [f"app.task_{i}" for i in range(20)]
ERRORS = ["ValueError", "TimeoutError", "KeyError", "ConnectionError", "RuntimeError"]
COLUMNS = (
    "id", "name", "queue", "status", "payload", "error", "metadata", "attempt",
    "max_attempts", "priority", "worker_id", "run_at_ms", "created_at_ms", "updated_at_ms",
    "completed_at_ms",
)  # fmt: skip


# -- the data -------------------------------------------------------------------------------


def rows(n: int, now_ms: int, seed: int = 7) -> Iterator[tuple[Any, ...]]:
    """N task rows, oldest first, over the last 7 days; ids grow with creation."""
    rng = random.Random(seed)
    step = 7 * DAY_MS / max(n, 1)
    start = now_ms - 7 * DAY_MS
    for i in range(n):
        created = int(start + i * step)
        roll = rng.random()
        # The newest tasks are the ones still queued or running.
        young = i > n - n * 0.04
        if young and roll < 0.75:
            status = "queued"
        elif young and roll < 0.80:
            status = "running"
        elif roll < 0.08:
            status = "failed"
        elif roll < 0.12:
            status = "canceled"
        else:
            status = "succeeded"
        error = None
        if status == "failed":
            kind = ERRORS[int(rng.random() ** 2 * len(ERRORS))]
            error = json.dumps({"type": kind, "code": "handler_error",
                                "message": f"{kind} in step {i % 13}", "retryable": False,
                                "details": {}})  # fmt: skip
        done = created + rng.randint(5, 60_000) if status not in ("queued", "running") else None
        worker = "bench-worker" if status != "queued" else None
        yield (
            f"task_{i:026d}", NAMES[i % len(NAMES)], QUEUES[(i // 7) % len(QUEUES)], status,
            json.dumps({"n": i, "user": f"u{i % 1000}"}), error, "{}",
            1 if status != "queued" else 0, 3, 0, worker, created, created,
            done or created, done,
        )  # fmt: skip


def load_sqlite(path: str, n: int) -> float:
    async def migrate() -> None:
        store = SQLiteStore(path)
        await store.connect()
        await load_counts(store)
        await store.close()

    asyncio.run(migrate())
    started = time.perf_counter()
    marks = ", ".join("?" for _ in COLUMNS)
    with sqlite3.connect(path) as conn:
        conn.execute("pragma synchronous = off")
        batch: list[tuple[Any, ...]] = []
        for row in rows(n, int(time.time() * 1000)):
            batch.append(row)
            if len(batch) == 50_000:
                conn.executemany(f"insert into cairnq_tasks ({', '.join(COLUMNS)}) "
                                 f"values ({marks})", batch)  # fmt: skip
                batch.clear()
        if batch:
            conn.executemany(f"insert into cairnq_tasks ({', '.join(COLUMNS)}) values ({marks})",
                             batch)  # fmt: skip
        conn.commit()
        conn.execute("analyze")
    return time.perf_counter() - started


def load_postgres(dsn: str, n: int) -> float:
    async def migrate() -> None:
        store = PostgresStore(dsn, migrate=True)
        await store.connect()
        await load_counts(store)
        await store.close()

    asyncio.run(migrate())
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Loading only: no notification per row.
        conn.execute("alter table cairnq_tasks disable trigger user")
        with conn.cursor() as cur:
            copy_sql = f"copy cairnq_tasks ({', '.join(COLUMNS)}) from stdin"
            with cur.copy(copy_sql) as copy:
                for row in rows(n, int(time.time() * 1000)):
                    copy.write_row(row)
        conn.execute("alter table cairnq_tasks enable trigger user")
        conn.execute("analyze cairnq_tasks")
    return time.perf_counter() - started


def counts(now_ms: int, seed: int = 11) -> list[CountRow]:
    """Per-queue counters as busy workers leave them: every period each width keeps,
    for every queue, 20 bins of run times over the outcomes and 8 of waits."""
    rng = random.Random(seed)
    made: list[CountRow] = []
    for width in WIDTHS_S:
        width_ms = width * 1000
        last = now_ms - now_ms % width_ms
        for k in range(KEEP_MS[width] // width_ms):
            start = last - k * width_ms
            for queue in QUEUES:
                for b in range(20):
                    series = OUTCOMES[0] if b < 14 else OUTCOMES[1 + b % 4]
                    made.append(CountRow(width, start, queue, series, 20 + b, rng.randint(1, 900)))
                made += [CountRow(width, start, queue, WAIT, 4 + b, rng.randint(1, 900))
                         for b in range(8)]  # fmt: skip
    return made


async def load_counts(store: SQLiteStore | PostgresStore) -> int:
    rows = counts(int(time.time() * 1000))
    await store.queue_counts.add(rows)
    return len(rows)


# -- the requests ---------------------------------------------------------------------------


class Browser:
    def __init__(self, server: DashboardServer) -> None:
        self.server = server
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)

    def get(self, path: str) -> tuple[int, str, float]:
        """(status, body, client wall seconds)."""
        started = time.perf_counter()
        self.conn.request("GET", path, headers={"Host": "127.0.0.1"})
        response = self.conn.getresponse()
        body = response.read().decode()
        return response.status, body, time.perf_counter() - started

    def close(self) -> None:
        self.conn.close()


def timed(browser: Browser, paths: Callable[[int], str], views: int,
          before: Callable[[], None] = lambda: None) -> dict[str, Any]:  # fmt: skip
    server_ms, client_ms = [], []
    for i in range(views):
        before()
        status, body, wall = browser.get(paths(i))
        if status != 200:
            raise RuntimeError(f"{paths(i)} answered {status}: {body[-600:]}")
        server_ms.append(browser.server.timings()[-1][1] * 1000)
        client_ms.append(wall * 1000)
    return {
        "median_ms": statistics.median(server_ms),
        "p95_ms": percentile(server_ms, 95),
        "max_ms": max(server_ms),
        "client_median_ms": statistics.median(client_ms),
    }


def next_links(browser: Browser, start: str, pages: int) -> list[str]:
    """The paths of `pages` successive Next links from `start`."""
    found, path = [], start
    for _ in range(pages):
        _, body, _ = browser.get(path)
        link = re.search(r'rel="next" href="([^"]+)"', body)
        if link is None:
            break
        path = link.group(1).replace("&amp;", "&")
        found.append(path)
    return found


def watchers(server: DashboardServer, data: DashboardData, count: int, seconds: float) -> float:
    """Snapshot reads per second while `count` browsers poll the overview."""
    stop = threading.Event()

    def poll() -> None:
        browser = Browser(server)
        try:
            while not stop.is_set():
                browser.get("/")
                stop.wait(0.25)
        finally:
            browser.close()

    threads = [threading.Thread(target=poll, daemon=True) for _ in range(count)]
    before = data.refreshes
    started = time.monotonic()
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(30)
    return (data.refreshes - before) / (time.monotonic() - started)


def config_file(folder: Path, backend: Backend, target: str) -> Path:
    database = {"path": target} if backend == "sqlite" else {"dsn": target}
    path = folder / "dashboard-bench.yaml"
    path.write_text(json.dumps({
        "version": 1, "database": database, "handlers": ["cairnqd.demo:registry"],
        "groups": {"g": {"queues": QUEUES}},
        "dashboard": {"listen": "127.0.0.1:0", "refresh": "1s"},
        "metrics": {"listen": "off"}, "runtime_dir": str(folder / "run"),
    }))  # fmt: skip
    return path


async def bench_backend(backend: Backend, args: argparse.Namespace) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    async with fresh_target(backend, "dashboard") as target:
        load = load_sqlite if backend == "sqlite" else load_postgres
        seconds = await asyncio.to_thread(load, target, args.tasks)
        print(f"{backend}: loaded {args.tasks:,} tasks in {seconds:.1f}s", flush=True)
        with tempfile.TemporaryDirectory() as folder:
            config = load_config(str(config_file(Path(folder), backend, target)))
            data = DashboardData(config)
            server = DashboardServer(config, data)
            server.start()
            began = time.monotonic()
            # The pages are timed with their indexes built; a flag, no event to await.
            while not data.indexes_ready:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            print(f"{backend}: indexes built in {time.monotonic() - began:.1f}s", flush=True)
            try:
                results = await asyncio.to_thread(measure, backend, args, server, data)
            finally:
                server.stop()
    return results


def measure(backend: Backend, args: argparse.Namespace, server: DashboardServer,
            data: DashboardData) -> list[dict[str, Any]]:  # fmt: skip
    browser = Browser(server)
    views = args.views
    n = args.tasks
    rng = random.Random(3)
    deep = next_links(browser, "/tasks?status=succeeded", 30)
    deep_all = next_links(browser, "/tasks", 30)
    created_90 = int(time.time() * 1000) - 7 * DAY_MS + int(7 * DAY_MS * 0.1)
    cases: list[tuple[str, Callable[[int], str], Callable[[], None]]] = [
        ("overview page", lambda i: "/", lambda: None),
        ("overview, waiting for its snapshot read", lambda i: "/", data.invalidate),
        ("failed page", lambda i: "/failed", lambda: None),
        ("charts: last hour (as browsers get it)", lambda i: "/charts?range=1h", lambda: None),
        ("charts: last week (as browsers get it)", lambda i: "/charts?range=7d", lambda: None),
        ("charts: last hour, read afresh", lambda i: "/charts?range=1h", data.forget_charts),
        ("charts: last day, read afresh", lambda i: "/charts?range=24h", data.forget_charts),
        ("charts: last week, read afresh", lambda i: "/charts?range=7d", data.forget_charts),
        ("tasks: newest created", lambda i: "/tasks", lambda: None),
        ("tasks: newest due", lambda i: "/tasks?sort=run_at", lambda: None),
        ("tasks: newest finished", lambda i: "/tasks?sort=finished", lambda: None),
        ("tasks: status=failed", lambda i: "/tasks?status=failed", lambda: None),
        ("tasks: status=queued by due", lambda i: "/tasks?status=queued&sort=run_at",
         lambda: None),
        ("tasks: queue+status", lambda i: f"/tasks?queue={QUEUES[i % 8]}&status=succeeded",
         lambda: None),
        ("tasks: name", lambda i: f"/tasks?name={NAMES[i % 20]}", lambda: None),
        ("tasks: failed, finished", lambda i: "/tasks?status=failed&sort=finished",
         lambda: None),
        ("tasks: last 10 min", lambda i: "/tasks?from=" + str(int(time.time() * 1000) - 600_000),
         lambda: None),
        ("tasks: 1-30 pages deep (succeeded)", lambda i: deep[i % len(deep)], lambda: None),
        ("tasks: 1-30 pages deep (all)", lambda i: deep_all[i % len(deep_all)], lambda: None),
        ("tasks: cursor 90% down",
         lambda i: "/tasks?cursor=" + encode_cursor("created", created_90, f"task_{n // 10:026d}"),
         lambda: None),
        ("task page", lambda i: f"/task/task_{rng.randrange(n):026d}", lambda: None),
    ]  # fmt: skip
    results = []
    for label, paths, before in cases:
        stats = timed(browser, paths, views, before)
        results.append({"backend": backend, "tasks": n, "page": label, **stats})
        print(f"  {label}: median {stats['median_ms']:.1f} ms", flush=True)
    browser.close()
    for count in args.browsers:
        rate = watchers(server, data, count, args.watch)
        results.append({"backend": backend, "tasks": n, "page": f"{count} browsers watching",
                        "reads_per_s": rate})  # fmt: skip
        print(f"  {count} browsers: {rate:.2f} snapshot reads/s", flush=True)
    return results


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", choices=BACKENDS)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--views", type=int, default=25, help="requests per page kind")
    parser.add_argument("--browsers", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--watch", type=float, default=10.0, help="seconds per browser count")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    for backend in args.backend or BACKENDS:
        results += await bench_backend(backend, args)
    pages = [r for r in results if "median_ms" in r]
    print_table(
        f"Dashboard server time per page ({args.views} views each; target median <= "
        f"{TARGET_MS:.0f} ms)",
        ["backend", "tasks", "page", "median ms", "p95 ms", "max ms", "client median ms", "ok"],
        [[r["backend"], fmt(r["tasks"]), r["page"], fmt(r["median_ms"], 1),
          fmt(r["p95_ms"], 1), fmt(r["max_ms"], 1), fmt(r["client_median_ms"], 1),
          "yes" if r["median_ms"] <= TARGET_MS else "NO"] for r in pages],
    )  # fmt: skip
    watching = [r for r in results if "reads_per_s" in r]
    print_table(
        "Overview snapshot reads per second while browsers poll every 250 ms (refresh 1s)",
        ["backend", "tasks", "browsers", "reads/s"],
        [[r["backend"], fmt(r["tasks"]), r["page"], fmt(r["reads_per_s"], 2)] for r in watching],
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main_entry(main)
