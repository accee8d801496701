"""Drain through PgBouncer against drain direct, through the daemon, interleaved in one run.

    python -m bench.pooler [--tasks 20000] [--processes 2] [--repeats 3]

The same daemon config drains N pre-loaded no-op tasks twice per round, alternating which
goes first: once with `database.dsn` straight to Postgres, once through a PgBouncer in
transaction mode (`database.pooler: transaction`, `direct_dsn` for the parent's LISTEN
and leadership). The aim: through the pooler within 25% of direct. PgBouncer is started
by the test suite's launcher (`tests/pooler/pgbouncer.py`), on a free port, with its
default pool of 20 server connections.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import print_table
from bench.daemon import Daemon, Database, pending, preload, wait_for
from tests.pooler.pgbouncer import PgBouncer

ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def drain(tmp: Path, pooled: PgBouncer | None, processes: int, n: int) -> float:
    db = Database("postgres", ADMIN_DSN, tmp)
    try:
        preload(db, 0)  # migrate before anyone connects
        direct = db.target
        if pooled is not None:  # the daemon's config only; the bench loads tasks directly
            db.target = {
                "dsn": pooled.dsn(db.dsn),
                "pooler": "transaction",
                "direct_dsn": db.dsn,
                "auto_migrate": True,
            }
        daemon = Daemon(db, tmp, processes)
        db.target = direct
        try:
            wait_for("children ready", lambda: daemon.ready() == processes, timeout=60)
            preload(db, n)
            started = time.perf_counter()
            wait_for("drain", lambda: pending(db) == 0, every=0.02)
            return n / (time.perf_counter() - started)
        finally:
            daemon.stop()
    finally:
        db.drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    bouncer = PgBouncer("transaction").start()
    rates: dict[str, list[float]] = {"direct": [], "PgBouncer (transaction)": []}
    try:
        with tempfile.TemporaryDirectory(prefix="cairnqd-bench-pooler-") as tmp:
            for round_ in range(args.repeats):
                order: list[tuple[str, Any]] = [
                    ("direct", None), ("PgBouncer (transaction)", bouncer)
                ]  # fmt: skip
                if round_ % 2:
                    order.reverse()
                for label, pooled in order:
                    rate = drain(Path(tmp), pooled, args.processes, args.tasks)
                    rates[label].append(rate)
                    print(f"round {round_ + 1}: {label}: {rate:,.0f} tasks/s", flush=True)
    finally:
        bouncer.stop()
    direct = statistics.median(rates["direct"])
    rows = [
        [label, f"{statistics.median(r):,.0f}", f"{statistics.median(r) / direct:.2f}"]
        for label, r in rates.items()
    ]
    print_table(
        f"drain through the daemon, {args.processes} children, {args.tasks:,} tasks "
        f"(median of {args.repeats})",
        ["database", "tasks/s", "÷ direct"],
        rows,
    )


if __name__ == "__main__":
    main()
