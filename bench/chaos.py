"""SIGKILL chaos through the daemon: what crashes cost, with and without prefetch.

10,000 tasks of 1-5 ms (max_attempts 3) through 2 groups x 2 children x concurrency 8,
while a ready child is SIGKILLed every 0.3 s until every task has ended. Per run:
tasks that ended `failed`, failed tasks that never ran (no execution recorded: their
attempts went on kills while they waited in a backlog), and tasks executed more than
once (killed mid-run, or finished but killed before the result was written).

    python -m bench.chaos --backend sqlite --backend postgres --prefetch auto --prefetch 0 \\
        --repeats 3

Executions are counted by the handler itself (`bench.daemon_handlers:record`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from bench.daemon import ENV, HANDLERS, REPO, Database, children_of, process_title


def run_once(backend: str, dsn: str, tmp: Path, prefetch: str, n: int) -> dict[str, float]:
    db = Database(backend, dsn, tmp)
    log = tmp / f"runs-{uuid.uuid4().hex[:6]}.log"
    group = {"queues": ["q"], "processes": 2, "concurrency": 8, "prefetch": prefetch}
    config = {
        "version": 1,
        "database": db.target,
        "handlers": [HANDLERS],
        "runtime_dir": str(tmp / "run"),
        "metrics": {"listen": "off"},
        "retention": {"rules": []},
        "supervisor": {"restart_budget": 100000, "backoff_max": "500ms"},
        "groups": {"a": dict(group), "b": dict(group)},
    }
    (tmp / "run").mkdir(exist_ok=True)
    path = tmp / f"chaos-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(config))
    daemon = None
    try:
        subprocess.run(
            [sys.executable, "-m", "bench.chaos", "--submit", json.dumps(db.target), str(log),
             str(n)],
            check=True, env=ENV,
        )  # fmt: skip
        with open(tmp / "daemon.log", "ab") as out:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "cairnqd.cli", "-c", str(path)],
                stdout=out, stderr=subprocess.STDOUT, env=ENV,
            )  # fmt: skip
        started = time.monotonic()
        kills = 0
        while db.scalar("select count(*) from cairnq_tasks where status in ('queued','running')"):
            ready = [p for p in children_of(daemon.pid) if process_title(p).endswith(" ready")]
            if ready:
                os.kill(ready[kills % len(ready)], signal.SIGKILL)
                kills += 1
            time.sleep(0.3)
            if time.monotonic() - started > 600:
                raise TimeoutError("chaos run did not finish in 10 minutes")
        elapsed = time.monotonic() - started
        runs = Counter(line.split()[0] for line in log.read_text().splitlines())
        failed = [r for r in _ids(db, "failed")]
        return {
            "kills": float(kills),
            "seconds": elapsed,
            "failed": float(len(failed)),
            "failed_never_ran": float(sum(1 for t in failed if t not in runs)),
            "ran_more_than_once": float(sum(1 for c in runs.values() if c > 1)),
        }
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
        db.drop()


def _ids(db: Database, status: str) -> list[str]:
    if db.backend == "sqlite":
        import sqlite3

        with sqlite3.connect(db.path) as conn:
            return [r[0] for r in conn.execute("select id from cairnq_tasks where status = ?",
                                               (status,))]  # fmt: skip
    import psycopg

    with psycopg.connect(db.dsn) as conn:
        rows = conn.execute("select id from cairnq_tasks where status = %s", (status,))
        return [r[0] for r in rows]


def _submit(target: dict[str, Any], log: str, n: int) -> None:
    import asyncio

    import cairnqd

    async def go() -> None:
        store: cairnqd.TaskStore = (
            cairnqd.SQLiteStore(target["path"]) if "path" in target
            else cairnqd.PostgresStore(target["dsn"])
        )  # fmt: skip
        async with cairnqd.CairnQ(store) as client:
            await client.submit_many(
                [
                    {"name": "bench.record", "queue": "q", "max_attempts": 3,
                     "payload": {"log": log, "seconds": 0.001 + (i % 5) / 1000}}
                    for i in range(n)
                ]
            )  # fmt: skip

    asyncio.run(go())


def main() -> None:
    if sys.argv[1:2] == ["--submit"]:
        _submit(json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", choices=("sqlite", "postgres"))
    parser.add_argument("--prefetch", action="append", help="auto or an integer (repeatable)")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "bench/out"))
    args = parser.parse_args()
    results: dict[str, Any] = {"tasks": args.tasks, "repeats": args.repeats}
    with tempfile.TemporaryDirectory() as tmpdir:
        for backend in args.backend or ["sqlite", "postgres"]:
            for prefetch in args.prefetch or ["auto", "0"]:
                setting: Any = prefetch if prefetch == "auto" else int(prefetch)
                runs = [
                    run_once(backend, args.dsn, Path(tmpdir), setting, args.tasks)
                    for _ in range(args.repeats)
                ]
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                results[f"{backend}_prefetch_{prefetch}"] = {"median": med, "runs": runs}
                print(
                    f"{backend:8} prefetch={prefetch:4}: failed {med['failed']:.0f}, "
                    f"failed never ran {med['failed_never_ran']:.0f}, ran twice+ "
                    f"{med['ran_more_than_once']:.0f} ({med['kills']:.0f} kills, "
                    f"{med['seconds']:.0f} s)",
                    flush=True,
                )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chaos.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
