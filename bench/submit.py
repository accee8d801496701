"""Submit rate: one at a time and in batches of 1,000.

    python -m bench.submit [--backend sqlite|postgres]... [--repeats 3] [--single 2000]
                           [--batches 20] [--no-peers]

Rows, each on a fresh database with the client connected (migrations done) before the
clock starts:
- `ours` / `cairnq` single: `--single` sequential awaits of
  `submit("bench.unclaimed", {"i": i})`.
- `ours` / `cairnq` concurrent: `--single` submits from `--coroutines` (64) coroutines, each
  awaiting its own `submit`s one after another (a web application's pattern).
- `ours` batch: `--batches` calls of `submit_many` with 1,000 items each.
- `raw` batch: the limit beside `ours` batch. The store's own `insert_many` statement
  alone, `--batches` transactions of 1,000 rows whose parameters (checked, encoded,
  ids made) are ready before the clock starts; durable settings as the store's
  (SQLite WAL with synchronous=FULL, Postgres synchronous_commit=on).
- Postgres peers (unless `--no-peers`): procrastinate `defer_async` / `batch_defer_async`
  and pgqueuer `enqueue` (single and list form), same counts.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from bench import peers
from bench.common import (
    UNCLAIMED,
    Backend,
    Case,
    Point,
    Run,
    add_common_args,
    chosen_backends,
    fmt,
    fresh_target,
    main_entry,
    print_table,
    run_cases,
    save,
)

BATCH = 1000


def sdk_client(impl: str, backend: Backend, target: str) -> Any:
    if impl == "ours":
        import cairnqd as lib
    else:
        import cairnq as lib  # type: ignore[no-redef]
    return lib.CairnQ.sqlite(target) if backend == "sqlite" else lib.CairnQ.postgres(target)


async def sdk_once(
    impl: str, mode: str, backend: Backend, n_single: int, batches: int, coroutines: int = 64
) -> Run:
    async with fresh_target(backend, "submit") as target:
        client = sdk_client(impl, backend, target)
        async with client:
            if mode == "concurrent":
                each = max(1, n_single // coroutines)

                async def submitter(c: int) -> None:
                    for i in range(each):
                        await client.submit(UNCLAIMED, {"c": c, "i": i})

                start = time.perf_counter()
                await asyncio.gather(*(submitter(c) for c in range(coroutines)))
                elapsed, n = time.perf_counter() - start, each * coroutines
            elif mode == "single":
                start = time.perf_counter()
                for i in range(n_single):
                    await client.submit(UNCLAIMED, {"i": i})
                elapsed, n = time.perf_counter() - start, n_single
            else:
                items = [{"name": UNCLAIMED, "payload": {"i": i}} for i in range(BATCH)]
                start = time.perf_counter()
                for _ in range(batches):
                    await client.submit_many(items)
                elapsed, n = time.perf_counter() - start, batches * BATCH
    return Run({"tasks_per_s": n / elapsed, "elapsed_s": elapsed, "tasks": n})


def _module(name: str, older_name: str) -> Any:
    """Module `name` of the tree under test, or `older_name` in a tree from before it moved."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return importlib.import_module(older_name)


async def raw_once(backend: Backend, batches: int) -> Run:
    """The bare `insert_many` statement, `batches` transactions of BATCH rows."""
    from cairnqd._protocol import statement
    from cairnqd.store.arguments import SubmitRequest
    from cairnqd.store.base import wall_clock_ms

    # Under bench.ab the "before" tree may predate the dialect packages.
    bind = _module("cairnqd.store.postgres.connect", "cairnqd.store.pg_connect").bind
    statements = _module("cairnqd.store.sqlite.statements", "cairnqd.store.sqlite_statements")
    run_rows = statements.run_rows
    from cairnqd.store.statement_params import insert_many_params, insert_rows

    async with fresh_target(backend, "submit") as target:
        async with sdk_client("ours", backend, target):
            pass  # migrated

        def one_run() -> list[dict[str, Any]]:
            # Each row's parameters as submit makes them; in ascending id order, as a
            # submit_many list's ids are handed out. (SubmitRequest's signature is the
            # same in older trees, so bench.ab can run this against them.)
            run = [SubmitRequest(UNCLAIMED, {"i": i}).insert_params() for i in range(BATCH)]
            return sorted(run, key=lambda params: str(params["id"]))

        runs = [one_run() for _ in range(batches)]
        stmt = statement(backend, "insert_many")
        insert: Callable[[], None]
        if backend == "sqlite":
            conn = sqlite3.connect(target, isolation_level=None)
            conn.execute("pragma journal_mode = wal")
            conn.execute("pragma synchronous = full")
            now = wall_clock_ms()
            values = iter([insert_rows(run, now) for run in runs])

            def insert() -> None:
                conn.execute("BEGIN IMMEDIATE")
                run_rows(conn, stmt, next(values))
                conn.execute("COMMIT")

            close = conn.close
        else:
            pg = psycopg.connect(target, autocommit=True)
            pg.execute("set synchronous_commit = on")
            params = iter([bind(stmt, insert_many_params(run)) for run in runs])

            def insert() -> None:
                with pg.transaction():
                    pg.execute(stmt.text, next(params), prepare=True).fetchall()

            close = pg.close
        try:
            start = time.perf_counter()
            for _ in range(batches):
                insert()
            elapsed, n = time.perf_counter() - start, batches * BATCH
        finally:
            close()
    return Run({"tasks_per_s": n / elapsed, "elapsed_s": elapsed, "tasks": n})


async def peer_once(peer: str, mode: str, n_single: int, batches: int) -> Run:
    async with (
        fresh_target("postgres", "submit") as target,
        peers.enqueuer(peer, target) as (one, many),
    ):
        start = time.perf_counter()
        if mode == "single":
            for i in range(n_single):
                await one(i)
            n = n_single
        else:
            for _ in range(batches):
                await many(BATCH)
            n = batches * BATCH
        elapsed = time.perf_counter() - start
    return Run({"tasks_per_s": n / elapsed, "elapsed_s": elapsed, "tasks": n})


def report(points: Sequence[Point]) -> None:
    rows = [
        [
            p.labels["backend"],
            p.labels["impl"],
            p.labels["mode"],
            fmt(p.median("tasks"), 0),
            fmt(p.median("tasks_per_s")),
        ]
        for p in points
    ]
    print_table("submit (median of runs)", ["backend", "impl", "mode", "tasks", "tasks/s"], rows)
    by_key = {(p.labels["backend"], p.labels["impl"], p.labels["mode"]): p for p in points}
    for backend in ("sqlite", "postgres"):
        for mode in ("single", "concurrent"):
            ours, theirs = (
                by_key.get((backend, "ours", mode)),
                by_key.get((backend, "cairnq", mode)),
            )
            if ours and theirs:
                a, b = ours.median("tasks_per_s"), theirs.median("tasks_per_s")
                if a and b:
                    print(f"{backend}: {mode} submit ours/cairnq = {a / b:.2f}x")
        batch, bare = by_key.get((backend, "ours", "batch")), by_key.get((backend, "raw", "batch"))
        rate, limit = (
            (batch.median("tasks_per_s"), bare.median("tasks_per_s")) if batch and bare else (0, 0)
        )
        if rate and limit:
            print(f"{backend}: submit_many ours / the bare statement = {rate / limit:.2f}")


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--single", type=int, default=2000, help="one-at-a-time submits")
    parser.add_argument("--batches", type=int, default=20, help="batches of 1,000")
    parser.add_argument("--coroutines", type=int, default=64, help="for the concurrent mode")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--out", default="submit")
    args = parser.parse_args(argv)
    cases: list[Case] = []
    for backend in chosen_backends(args):
        plan: list[tuple[str, str]] = [
            ("ours", "single"),
            ("cairnq", "single"),
            ("ours", "concurrent"),
            ("cairnq", "concurrent"),
            ("ours", "batch"),
            ("raw", "batch"),
        ]
        if backend == "postgres" and not args.no_peers:
            for peer in peers.PEERS:
                if peers.available(peer):
                    plan += [(peer, "single"), (peer, "batch")]
        for impl, mode in plan:
            labels = {"backend": backend, "impl": impl, "mode": mode}

            async def once(
                run: int, impl: str = impl, mode: str = mode, b: Backend = backend
            ) -> Run:
                if impl in peers.PEERS:
                    return await peer_once(impl, mode, args.single, args.batches)
                if impl == "raw":
                    return await raw_once(b, args.batches)
                return await sdk_once(impl, mode, b, args.single, args.batches, args.coroutines)

            cases.append(Case(labels, once))
    config = {k: v for k, v in vars(args).items() if k != "backend"}
    points = await run_cases(cases, args.repeats, lambda pts: save(args.out, config, pts))
    report(points)


if __name__ == "__main__":
    main_entry(main)
