"""The raw limit: a bare synchronous SQL loop doing only claim + complete.

    python bench/raw_proc.py --backend sqlite|postgres --target PATH_OR_DSN --batch 1|256

Runs the protocol's own statements (`claim_one_queue` from protocol/sql and
`complete` / `complete_many` from protocol/extensions/sql, through
`cairnqd._protocol.statement` and the stores' bind helpers) against the full schema
with every index and, on Postgres, the notify trigger. Durable settings: SQLite WAL
with synchronous=FULL, Postgres synchronous_commit=on.

Per loop iteration, a claim of up to `--batch` tasks (`claim_one_queue`), then
`complete` for a batch of 1 or one set-based `complete_many` for more:
- `--tx one` (default; the `raw1`/`raw256` rows of bench/RESULTS.md): claim and
  complete in the same transaction, one commit per iteration.
- `--tx two`: the claim commits, then the complete commits on its own, as a worker
  must (a handler runs in between): two commits per iteration.

`--hold-ms MS` (with `--tx one`): each batch "runs" for MS after its claim commits (a
`time.sleep`), and its complete rides in the transaction of the next claim, as a
worker under a `concurrency: 1` limit hands its room over: the `raw_serial` row of
bench/RESULTS.md, the most tasks of MS a second that one commit per task allows.

Prints `READY raw-<pid>`, waits for `GO`, loops until a claim comes back empty, then
prints `DONE handled=<n> end=<unix time of the last commit> cpu=<process CPU s since
GO> dbcpu=<its Postgres backend's CPU s since GO>` (Postgres on the same host).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg

from cairnqd._protocol import Statement, statement
from cairnqd.store.base import wall_clock_ms
from cairnqd.store.postgres.connect import bind as pg_bind
from cairnqd.store.sqlite.statements import bind as sqlite_bind
from cairnqd.store.statement_params import complete_many_params

QUEUE = "default"
LEASE_MS = 30_000


def sqlite_loop(
    target: str, batch: int, two_tx: bool, worker_id: str, hold_s: float
) -> tuple[int, float]:
    conn = sqlite3.connect(target, isolation_level=None, cached_statements=64)
    conn.execute("pragma busy_timeout = 10000")
    conn.execute("pragma journal_mode = wal")
    conn.execute("pragma synchronous = FULL")
    claim = statement("sqlite", "claim_one_queue")
    finish = statement("sqlite", "complete" if batch == 1 else "complete_many")
    claim_params = {
        "queue": QUEUE,
        "names": None,
        "worker_id": worker_id,
        "lease_ms": LEASE_MS,
        "limit": batch,
    }

    def run(stmt: Statement, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        cursor = conn.execute(stmt.text, sqlite_bind(stmt, params, wall_clock_ms))
        return cursor.fetchall()

    handled, end = 0, time.time()
    held: list[str] = []  # with hold_s: the batch that ran, settled with the next claim
    ready_go()
    while True:
        conn.execute("BEGIN IMMEDIATE")
        if held:
            complete(run, finish, held, worker_id)
        cursor = conn.execute(claim.text, sqlite_bind(claim, claim_params, wall_clock_ms))
        id_col = [d[0] for d in cursor.description].index("id")
        ids = [row[id_col] for row in cursor.fetchall()]
        if not ids:
            conn.execute("COMMIT")
            end = time.time() if held else end
            break
        if two_tx or hold_s:
            conn.execute("COMMIT")
        if hold_s:
            time.sleep(hold_s)
            held = ids
        else:
            complete(run, finish, ids, worker_id)
        if not two_tx and not hold_s:
            conn.execute("COMMIT")
        handled += len(ids)
        end = time.time()
    conn.close()
    return handled, end


def postgres_loop(
    target: str, batch: int, two_tx: bool, worker_id: str, hold_s: float
) -> tuple[int, float]:
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("set synchronous_commit = on")
        claim = statement("postgres", "claim_one_queue")
        finish = statement("postgres", "complete" if batch == 1 else "complete_many")
        claim_params = {
            "queue": QUEUE,
            "names": None,
            "worker_id": worker_id,
            "lease_ms": LEASE_MS,
            "limit": batch,
        }

        def run(stmt: Statement, params: dict[str, Any]) -> list[tuple[Any, ...]]:
            cursor = conn.execute(stmt.text, pg_bind(stmt, params), prepare=True)
            return cursor.fetchall() if cursor.description else []

        row = conn.execute("select pg_backend_pid()").fetchone()
        backend_pid = int(row[0]) if row else 0
        handled, end = 0, time.time()
        held: list[str] = []  # as in sqlite_loop
        ready_go()
        server_cpu_at_go = proc_cpu_seconds(backend_pid)
        while True:
            if not two_tx:
                conn.execute("begin")
            if held:
                complete(run, finish, held, worker_id)
            cursor = conn.execute(claim.text, pg_bind(claim, claim_params), prepare=True)
            assert cursor.description is not None
            id_col = [d.name for d in cursor.description].index("id")
            ids = [row[id_col] for row in cursor.fetchall()]
            if ids and not hold_s:
                complete(run, finish, ids, worker_id)
            if not two_tx:
                conn.execute("commit")
            if held and not ids:
                end = time.time()
            if ids and hold_s:
                time.sleep(hold_s)
                held = ids
            if not ids:
                break
            handled += len(ids)
            end = time.time()
        global server_cpu
        server_cpu = proc_cpu_seconds(backend_pid) - server_cpu_at_go
        return handled, end


def complete(
    run: Callable[[Statement, dict[str, Any]], list[tuple[Any, ...]]],
    finish: Statement,
    ids: list[str],
    worker_id: str,
) -> None:
    """Complete the claimed `ids` (`complete` for one, else one `complete_many`), and
    stop the run if any was not: a limit that settles nothing measures only claims."""
    if finish.name == "complete":
        rows = run(finish, {"id": ids[0], "worker_id": worker_id, "result": None})
    else:
        rows = run(finish, complete_many_params(worker_id, [(i, None) for i in ids]))
    if len(rows) != len(ids):
        sys.exit(f"raw loop: completed {len(rows)} of the {len(ids)} tasks it claimed")


cpu_at_go = 0.0
server_cpu = 0.0  # CPU of this loop's Postgres backend (same host), seconds


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process on this host, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ready_go() -> None:
    global cpu_at_go
    print(f"READY raw-{os.getpid()}", flush=True)
    if sys.stdin.readline().strip() != "GO":
        sys.exit(0)
    cpu_at_go = time.process_time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, choices=["sqlite", "postgres"])
    parser.add_argument("--target", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tx", choices=["one", "two"], default="one")
    parser.add_argument("--hold-ms", type=float, default=0.0, help="with --tx one")
    args = parser.parse_args()
    if args.hold_ms and args.tx == "two":
        parser.error("--hold-ms hands each batch's complete to the next claim: --tx one")
    loop: Callable[[str, int, bool, str, float], tuple[int, float]] = (
        sqlite_loop if args.backend == "sqlite" else postgres_loop
    )
    worker_id = f"raw-{os.getpid()}"
    handled, end = loop(args.target, args.batch, args.tx == "two", worker_id, args.hold_ms / 1000)
    cpu = time.process_time() - cpu_at_go
    print(f"DONE handled={handled} end={end:.6f} cpu={cpu:.4f} dbcpu={server_cpu:.4f}", flush=True)


if __name__ == "__main__":
    main()
