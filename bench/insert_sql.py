"""SQLite's insert_many statement alone: the store's row statement against one JSON
document unpacked by json_each (the statement it replaced), same rows, same file kind.

    python -m bench.insert_sql [--repeats 3] [--batches 20] [--rows 1000]

Each run inserts `--batches` transactions of `--rows` tasks into a fresh migrated file,
with the values prepared before the clock starts, so only SQLite's work and the
driver's binding are timed. `synchronous` is the store's default (full: a WAL fsync
per commit) and, for comparison, normal. The sides alternate per round; medians of
the rounds and each round's ratio are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cairnqd
from cairnqd._ids import new_task_id
from cairnqd._protocol import statement
from cairnqd.store.sqlite.statements import run_rows
from cairnqd.store.statement_params import insert_rows

# The statement the row statement replaced: one JSON array of positional arrays.
JSON_EACH = """
insert into cairnq_tasks (
    id, name, queue, status, payload, metadata, max_attempts, priority,
    parent_id, root_id, correlation_id, run_at_ms, created_at_ms, updated_at_ms
)
select
    json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
    'queued', json_extract(value, '$[3]'), json_extract(value, '$[4]'),
    json_extract(value, '$[5]'), json_extract(value, '$[6]'), json_extract(value, '$[7]'),
    json_extract(value, '$[8]'), json_extract(value, '$[9]'),
    :now_ms + json_extract(value, '$[10]'), :now_ms, :now_ms
from json_each(:new_tasks)
returning id, run_at_ms, created_at_ms
"""


def fresh_file(tmp: Path, n: int) -> str:
    path = str(tmp / f"insert-{n}.db")

    async def migrate() -> None:
        client = cairnqd.CairnQ(cairnqd.SQLiteStore(path))
        await client.connect()
        await client.close()

    asyncio.run(migrate())
    return path


def task_values(i: int) -> list[Any]:
    """id, name, queue, payload, metadata, max_attempts, priority: the values both
    statements take first (parent_id, root_id and correlation_id follow)."""
    task_id = new_task_id()
    return [task_id, "bench.unclaimed", "default", json.dumps({"i": i}), "{}", 3, 0]


def task_params(i: int) -> dict[str, Any]:
    """One validated keyless submit, as the store hands it to `insert_rows`."""
    keys = ("id", "name", "queue", "payload", "metadata", "max_attempts", "priority")
    params = dict(zip(keys, task_values(i), strict=True))
    return {**params, "parent_id": None, "root_id": params["id"], "correlation_id": None}


def connect(path: str, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, cached_statements=256)
    conn.execute("pragma journal_mode = wal")
    conn.execute(f"pragma synchronous = {synchronous}")
    return conn


def json_each_side(path: str, synchronous: str, batches: int, rows: int) -> float:
    conn = connect(path, synchronous)
    docs = []
    for _ in range(batches):
        batch = [[*task_values(i), None, None, None, 0] for i in range(rows)]
        for row in batch:
            row[8] = row[0]  # root_id
        docs.append(json.dumps(batch))
    start = time.perf_counter()
    for doc in docs:
        conn.execute("begin immediate")
        conn.execute(JSON_EACH, {"new_tasks": doc, "now_ms": int(time.time() * 1000)}).fetchall()
        conn.execute("commit")
    elapsed = time.perf_counter() - start
    conn.close()
    return batches * rows / elapsed


def row_statement_side(path: str, synchronous: str, batches: int, rows: int) -> float:
    conn = connect(path, synchronous)
    stmt = statement("sqlite", "insert_many")
    now = int(time.time() * 1000)
    # The store's own values, built before the clock starts.
    flats = [
        insert_rows([{**task_params(i), "delay_ms": 0} for i in range(rows)], now)
        for _ in range(batches)
    ]
    start = time.perf_counter()
    for flat in flats:
        conn.execute("begin immediate")
        run_rows(conn, stmt, flat)
        conn.execute("commit")
    elapsed = time.perf_counter() - start
    conn.close()
    return batches * rows / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args()
    sides: dict[str, Callable[[str, str, int, int], float]] = {
        "json_each": json_each_side,
        "row statement": row_statement_side,
    }
    print(f"SQLite {sqlite3.sqlite_version}; {args.batches} x {args.rows} rows per run")
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        n = 0
        for synchronous in ("full", "normal"):
            rates: dict[str, list[float]] = {name: [] for name in sides}
            for round_ in range(args.repeats):
                order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
                for name in order:
                    n += 1
                    path = fresh_file(tmp, n)
                    rates[name].append(sides[name](path, synchronous, args.batches, args.rows))
            base, new = rates["json_each"], rates["row statement"]
            ratios = " ".join(f"{b / a:.2f}" for a, b in zip(base, new, strict=True))
            print(
                f"synchronous={synchronous}: json_each {statistics.median(base):,.0f} rows/s "
                f"({1e6 / statistics.median(base):.1f} µs/row), row statement "
                f"{statistics.median(new):,.0f} rows/s ({1e6 / statistics.median(new):.1f} "
                f"µs/row); each round: {ratios}"
            )


if __name__ == "__main__":
    main()
