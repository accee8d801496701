"""How long a migration stalls the workers on a big Postgres database: the index that
cairnqd_0001 builds on `cairnq_task_keys`, built the way the runner builds it now
(`concurrently`, outside a transaction) and the way it was built before (a plain
`create index` inside the migration's transaction), side by side on the same rows.

Per round: a fresh database, migrated, holding N tasks each with a key (loaded by SQL).
Then for each way, in alternating order: the index and its ledger row are removed, a
load of keyed submits and claims runs against the database, and the migration is applied
while it runs. Measured: the longest and the p99 latency of the keyed submits (their
inserts into the key table are what a plain build blocks) and of the claims, and how
long the migration took. The raw limit beside it: the index built with nothing else
running, plainly.

    python -m bench.migrate_stall                  # 1,000,000 tasks, 3 rounds
    python -m bench.migrate_stall --tasks 50000 --repeats 1   # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import time

import psycopg

from bench.common import fmt, fresh_target, main_entry, percentile, print_table
from cairnqd.store.postgres import PostgresStore

INDEX = "cairnqd_task_keys_task_id_idx"
LEDGER = "cairnqd_0001_task_keys_task_idx.sql"
PLAIN = f"create index if not exists {INDEX} on cairnq_task_keys (task_id)"


def _sql(dsn: str, text: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(text)


def _load(dsn: str, n: int) -> None:
    """N queued tasks and a key for each, written by the server itself."""
    now = int(time.time() * 1000)
    _sql(
        dsn,
        "insert into cairnq_tasks (id, name, queue, status, payload, metadata, attempt, "
        "max_attempts, priority, root_id, run_at_ms, created_at_ms, updated_at_ms) "
        f"select 'task_' || lpad(g::text, 26, '0'), 'bench.noop', 'default', 'queued', "
        f"'{{}}', '{{}}', 0, 3, 0, 'task_' || lpad(g::text, 26, '0'), {now}, {now}, {now} "
        f"from generate_series(1, {n}) g",
    )
    _sql(
        dsn,
        "insert into cairnq_task_keys (key, task_id, created_at_ms, updated_at_ms) "
        f"select 'key-' || g, 'task_' || lpad(g::text, 26, '0'), {now}, {now} "
        f"from generate_series(1, {n}) g",
    )
    _sql(dsn, "analyze")


def _unapply(dsn: str) -> None:
    _sql(dsn, f"drop index if exists {INDEX}")
    _sql(dsn, f"delete from cairnqd_migrations where name = '{LEDGER}'")


async def _apply_plain(dsn: str) -> None:
    """The migration as the runner applied it before: one transaction, a plain build."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        await conn.execute("lock table cairnqd_migrations in exclusive mode")
        await conn.execute(PLAIN)
        await conn.execute(
            "insert into cairnqd_migrations (name, applied_at_ms) values (%s, %s)",
            (LEDGER, int(time.time() * 1000)),
        )


async def _apply_now(dsn: str) -> None:
    """The migration as the runner applies it now."""
    store = PostgresStore(dsn)
    await store.connect()
    await store.close()


async def _load_while(store: PostgresStore, done: asyncio.Event) -> tuple[list[float], list[float]]:
    """Keyed submits and claims, one after another, until `done`: their latencies (ms)."""
    submits: list[float] = []
    claims: list[float] = []
    i = 0
    while not done.is_set():
        i += 1
        began = time.perf_counter()
        await store.submit(name="bench.noop", key=f"new-{i}")
        submits.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        await store.claim(queues=["default"], worker_id="bench", limit=1)
        claims.append((time.perf_counter() - began) * 1000)
    return submits, claims


async def _measure(dsn: str, way: str) -> dict[str, float]:
    # Connected while the database is whole: a store checks the migrations only then.
    store = PostgresStore(dsn)
    await store.connect()
    _unapply(dsn)
    done = asyncio.Event()
    load = asyncio.create_task(_load_while(store, done))
    await asyncio.sleep(1.0)  # the load's own pace first
    began = time.perf_counter()
    await (_apply_plain(dsn) if way == "plain" else _apply_now(dsn))
    took = time.perf_counter() - began
    await asyncio.sleep(0.5)
    done.set()
    submits, claims = await load
    await store.close()
    return {
        "migration_s": took,
        "submit_max_ms": max(submits),
        "submit_p99_ms": percentile(submits, 0.99),
        "claim_max_ms": max(claims),
        "claim_p99_ms": percentile(claims, 0.99),
    }


async def _raw_build_s(dsn: str) -> float:
    _unapply(dsn)
    began = time.perf_counter()
    await asyncio.to_thread(_sql, dsn, PLAIN)
    return time.perf_counter() - began


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"plain": [], "concurrently": []}
    raw: list[float] = []
    for round_ in range(args.repeats):
        async with fresh_target("postgres", "migrate_stall") as dsn:
            await _apply_now(dsn)
            await asyncio.to_thread(_load, dsn, args.tasks)
            raw.append(await _raw_build_s(dsn))
            ways = ["plain", "concurrently"] if round_ % 2 == 0 else ["concurrently", "plain"]
            for way in ways:
                results[way].append(await _measure(dsn, way))
    keys = ["migration_s", "submit_max_ms", "submit_p99_ms", "claim_max_ms", "claim_p99_ms"]

    def median(way: str, key: str) -> float:
        values = sorted(r[key] for r in results[way])
        return values[len(values) // 2]

    rows: list[list[str]] = []
    for way in ("plain", "concurrently"):
        cells = [fmt(median(way, k), 2 if k == "migration_s" else 0) for k in keys]
        runs = " / ".join(fmt(r["submit_max_ms"]) for r in results[way])
        rows.append([way, *cells, runs])
    print_table(
        f"cairnqd_0001 on {args.tasks:,} keyed tasks (median of {args.repeats}); raw plain "
        f"build alone: {fmt(sorted(raw)[len(raw) // 2], 2)} s",
        ["build", *keys, "submit_max per run"],
        rows,
    )


if __name__ == "__main__":
    main_entry(main)
