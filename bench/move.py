"""`cairnqd move-to`'s speed beside its limit: tasks per second from a SQLite file into
Postgres, against a plain COPY of the same rows into an empty table.

    python -m bench.move [--tasks 20000] [--batch 5000] [--repeats 3]

The source holds `--tasks` queued tasks (filled once). Three timings, each round on
fresh Postgres databases, move and plain COPY side by side; medians of `--repeats`:

- `move`: `Move.run`, the copy of every table, batch by batch, each batch with its
  progress row in one transaction, into the protocol's indexed `cairnq_tasks`;
- `verify`: `Move.verify`, every batch read again on both sides and compared;
- `plain COPY`: the same rows read from the file in key order and sent in one COPY
  into an unindexed, trigger-less table of the same columns, one transaction: what
  reading SQLite and writing Postgres cost on this machine without the protocol.

Each on a database created for it and dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import time

import psycopg

from bench.common import fresh_target, main_entry, print_table
from cairnqd.store.move import Move
from cairnqd.store.sqlite import SQLiteStore

_STEP = 10_000


async def _fill(path: str, tasks: int) -> None:
    store = SQLiteStore(path)
    await store.connect()
    try:
        for start in range(0, tasks, _STEP):
            items = [
                {"name": "bench.unclaimed", "payload": {"i": i, "pad": "x" * 40}}
                for i in range(start, min(tasks, start + _STEP))
            ]
            await store.submit_many(items)
    finally:
        await store.close()


def _move(path: str, dsn: str, batch: int) -> tuple[float, float, int]:
    move = Move(path, dsn, batch=batch)
    try:
        move.plan()
        started = time.perf_counter()
        results = move.run()
        moved = time.perf_counter()
        verdict = move.verify(results)
        verified = time.perf_counter()
    finally:
        move.close()
    if not verdict.ok:
        raise SystemExit(f"the move did not verify: {verdict.differences[:3]}")
    return moved - started, verified - moved, sum(r.moved for r in results)


def _plain_copy(path: str, dsn: str) -> float:
    source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        columns = [r[1] for r in source.execute("pragma table_info(cairnq_tasks)")]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "create table plain (id text, name text, queue text, status text, "
                "payload jsonb, result jsonb, error jsonb, metadata jsonb, progress float8, "
                "message text, attempt int, max_attempts int, priority int, worker_id text, "
                "lease_until_ms bigint, run_at_ms bigint, cancel_requested_at_ms bigint, "
                "parent_id text, root_id text, correlation_id text, created_at_ms bigint, "
                "updated_at_ms bigint, completed_at_ms bigint)"
            )
            names = ", ".join(columns)
            started = time.perf_counter()
            rows = source.execute(f"select {names} from cairnq_tasks order by id")
            statement = f"copy plain ({names}) from stdin"
            with conn.transaction(), conn.cursor() as cur, cur.copy(statement) as copy:
                for row in rows:
                    copy.write_row(row)
            return time.perf_counter() - started
    finally:
        source.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks in the source")
    parser.add_argument("--batch", type=int, default=5_000, help="rows per batch")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (medians)")
    args = parser.parse_args()
    moves: list[float] = []
    verifies: list[float] = []
    plains: list[float] = []
    async with fresh_target("sqlite", "move_src") as path:
        await _fill(path, args.tasks)
        for round_ in range(args.repeats):
            async with fresh_target("postgres", "move_dst") as dsn:
                move_s, verify_s, moved = await asyncio.to_thread(_move, path, dsn, args.batch)
            async with fresh_target("postgres", "move_plain") as dsn:
                plain_s = await asyncio.to_thread(_plain_copy, path, dsn)
            moves.append(move_s)
            verifies.append(verify_s)
            plains.append(plain_s)
            print(
                f"  round {round_ + 1}/{args.repeats}: move {move_s:.2f} s, verify "
                f"{verify_s:.2f} s, plain COPY {plain_s:.2f} s",
                flush=True,
            )
    move_s, verify_s, plain_s = (statistics.median(v) for v in (moves, verifies, plains))
    print_table(
        f"move-to, {args.tasks:,} tasks, batches of {args.batch:,} (medians of {args.repeats})",
        ["what", "seconds", "rows/s", "of plain COPY"],
        [
            ["move", f"{move_s:.2f}", f"{moved / move_s:,.0f}", f"{plain_s / move_s:.0%}"],
            ["verify", f"{verify_s:.2f}", f"{moved / verify_s:,.0f}", "-"],
            ["plain COPY", f"{plain_s:.2f}", f"{moved / plain_s:,.0f}", "100%"],
        ],
    )


if __name__ == "__main__":
    main_entry(main)
