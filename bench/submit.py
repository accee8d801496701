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
- Postgres peers (unless `--no-peers`): procrastinate `defer_async` / `batch_defer_async`
  and pgqueuer `enqueue` (single and list form), same counts.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from typing import Any

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
                return await sdk_once(impl, mode, b, args.single, args.batches, args.coroutines)

            cases.append(Case(labels, once))
    config = {k: v for k, v in vars(args).items() if k != "backend"}
    points = await run_cases(cases, args.repeats, lambda pts: save(args.out, config, pts))
    report(points)


if __name__ == "__main__":
    main_entry(main)
