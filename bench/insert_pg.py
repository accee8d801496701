"""Postgres's bulk inserts alone: the server's CPU per row of each way in.

    python -m bench.insert_pg [--rounds 40] [--rows 1000] [--protocol-costs]

A long `submit_many` waits on the server (bench/RESULTS.md, "submit_many on Postgres"), so this
measures what the server spends per new row, not the wall clock: the backend's own
time on a CPU, from `/proc/PID/schedstat` (nanoseconds, the backend is on this
machine), around each statement. The variants, one transaction of `--rows` tasks
each, taken in a new random order every round so drift and the table's growth fall on
all alike; every transaction commits:

- `insert_many`: the JSON statement (insert_many.sql), and `copy`: the COPY stream
  (insert_copy.sql), each with the ids of a `submit_many` list (ascending) and with the
  same ids shuffled (as ids were drawn before a list's were handed out sorted).
- `--protocol-costs` adds two COPY variants that show what the protocol's schema costs
  per row: without its notify trigger, and without the trigger and the nine secondary
  indexes (both dropped inside the transaction, then rolled back: never committed).

Prints the median and quartiles of microseconds per row.
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

import cairnqd
from bench.common import UNCLAIMED, fresh_target, main_entry, print_table
from cairnqd._ids import new_task_ids
from cairnqd._protocol import statement
from cairnqd.store.arguments import insert_params_for
from cairnqd.store.postgres.bulk import copy_rows
from cairnqd.store.postgres.connect import bind
from cairnqd.store.statement_params import insert_many_params

VARIANTS = ("insert_many ascending", "insert_many shuffled", "copy ascending", "copy shuffled")
PROTOCOL_VARIANTS = ("copy, no trigger", "copy, no trigger or secondary indexes")
NOW_MS = 1_764_000_000_000
Conn = psycopg.AsyncConnection[Any]


def backend_cpu_ns(pid: int) -> int:
    """Nanoseconds backend `pid` has spent on a CPU (the first field of schedstat)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def make_run(rows: int, shuffled: bool) -> list[dict[str, Any]]:
    ids = new_task_ids(rows)
    if shuffled:
        random.shuffle(ids)
    item = {"name": UNCLAIMED}
    return [insert_params_for({**item, "payload": {"i": i}}, ids[i]) for i in range(rows)]


async def write(conn: Conn, variant: str, run: Sequence[dict[str, Any]]) -> None:
    if variant.startswith("insert_many"):
        stmt = statement("postgres", "insert_many")
        cursor = await conn.execute(stmt.text, bind(stmt, insert_many_params(run)), prepare=True)
        await cursor.fetchall()
    else:
        async with conn.cursor().copy(statement("postgres", "insert_copy").text) as copy:
            await copy.write(copy_rows(run, NOW_MS))


async def strip_schema(conn: Conn, variant: str) -> None:
    """Inside the open transaction: drop what `variant` measures without."""
    if "no trigger" not in variant:
        return
    await conn.execute("alter table cairnq_tasks disable trigger cairnq_tasks_notify")
    if "indexes" in variant:
        cursor = await conn.execute(
            "select indexname from pg_indexes where tablename = 'cairnq_tasks' "
            "and indexname <> 'cairnq_tasks_pkey'"
        )
        for (name,) in await cursor.fetchall():
            await conn.execute(f'drop index "{name}"')


async def measure(rounds: int, rows: int, variants: Sequence[str]) -> dict[str, list[float]]:
    per_row: dict[str, list[float]] = {v: [] for v in variants}
    async with fresh_target("postgres", "insert_pg") as dsn:
        async with cairnqd.CairnQ.postgres(dsn):
            pass  # migrated
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cursor = await conn.execute("select pg_backend_pid()")
            row = await cursor.fetchone()
            assert row is not None
            pid = int(row[0])
            for _ in range(rounds):
                order = list(variants)
                random.shuffle(order)
                for variant in order:
                    run = make_run(rows, shuffled="shuffled" in variant)
                    await conn.execute("begin")
                    await strip_schema(conn, variant)
                    before = backend_cpu_ns(pid)
                    await write(conn, variant, run)
                    per_row[variant].append((backend_cpu_ns(pid) - before) / rows / 1000)
                    stripped = "no trigger" in variant
                    await conn.execute("rollback" if stripped else "commit")
    return per_row


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.insert_pg")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--protocol-costs", action="store_true")
    args = parser.parse_args(argv)
    variants = VARIANTS + (PROTOCOL_VARIANTS if args.protocol_costs else ())
    per_row = await measure(args.rounds, args.rows, variants)
    table: list[list[str]] = []
    for variant in variants:
        values = per_row[variant]
        q1, median, q3 = statistics.quantiles(values, n=4)
        table.append([variant, f"{median:.2f}", f"{q1:.2f} to {q3:.2f}", str(len(values))])
    print_table(
        f"Postgres server CPU per inserted row, {args.rows}-row transactions",
        ["variant", "us/row (median)", "quartiles", "transactions"],
        table,
    )


if __name__ == "__main__":
    main_entry(main)
