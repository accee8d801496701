"""What a submit through the caller's transaction (`submit(tx=conn)`) costs, beside the
statement it runs and beside a standalone submit.

Per backend, in one process, on a fresh database, interleaved rounds of `--tasks`
keyless submits each, one at a time:

- `statement`: the raw limit, the `insert_many` statement a keyless submit runs, with
  its parameters made before the clock starts, executed through the caller's
  connection inside its open transaction (psycopg `AsyncConnection`; sqlite3);
- `statement + params`: the same, with what every submit does besides its statement
  (an id, the arguments checked, the row's values made) inside the loop;
- `tx=`: `await client.submit(name, payload, tx=conn)` in that open transaction:
  the same work, through the client and the store;
- `standalone`: `await client.submit(name, payload)`, which commits each task on its own
  (the store's group commit on SQLite, the coalescer on Postgres: one at a time here).

The caller's commit, once per round, is outside the timed loops. Prints the median
microseconds per submit over `--repeats` rounds and the ratio of `tx=` to
`statement + params`.

    python -m bench.tx_submit --backend sqlite --backend postgres --tasks 2000 --repeats 5
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from bench.common import fresh_target, main_entry, print_table
from cairnqd import CairnQ
from cairnqd._ids import new_task_ids
from cairnqd.store.arguments import insert_params_for
from cairnqd.store.executor import Session
from cairnqd.store.postgres.callertx import plain_session as pg_session
from cairnqd.store.sqlite.statements import SQLiteSession
from cairnqd.store.statement_params import insert_many_params, insert_rows

PAYLOAD = {"order": 42, "to": "someone@example.com"}


def _params(n: int) -> list[dict[str, Any]]:
    return [
        insert_params_for({"name": "receipt.send", "payload": PAYLOAD}, task_id)
        for task_id in new_task_ids(n)
    ]


async def _round(backend: str, client: CairnQ, target: str, n: int) -> dict[str, float]:
    """Microseconds per submit for each way, this round."""
    if backend == "sqlite":
        conn: Any = sqlite3.connect(target)
        session: Session = SQLiteSession(conn, lambda: int(time.time() * 1000))
        prepared = [{"values": insert_rows([p], int(time.time() * 1000))} for p in _params(n)]
        conn.execute("begin immediate")
    else:
        conn = await psycopg.AsyncConnection.connect(target)
        session = await pg_session(conn, _identity_of(client), None)
        prepared = [insert_many_params([p]) for p in _params(n)]

    async def statement() -> None:
        for params in prepared:
            await session.fetch("insert_many", params)

    async def with_params() -> None:
        # What every submit does besides its statement: an id, the arguments checked,
        # the row's values made (payload to JSON text).
        for task_id in new_task_ids(n):
            made = insert_params_for({"name": "receipt.send", "payload": PAYLOAD}, task_id)
            if backend == "sqlite":
                values: dict[str, Any] = {"values": insert_rows([made], int(time.time() * 1000))}
            else:
                values = insert_many_params([made])
            await session.fetch("insert_many", values)

    async def through_tx() -> None:
        for i in range(n):
            await client.submit("receipt.send", PAYLOAD, tx=conn)
            del i

    async def standalone() -> None:
        for i in range(n):
            await client.submit("receipt.send", PAYLOAD)
            del i

    out: dict[str, float] = {}
    for name, work in (("statement", statement), ("params", with_params), ("tx", through_tx)):
        out[name] = await _timed(work, n)
    if backend == "sqlite":
        conn.commit()
        conn.close()
    else:
        await conn.commit()
        await conn.close()
    out["standalone"] = await _timed(standalone, n)
    return out


def _identity_of(client: CairnQ) -> Callable[[], Awaitable[Any]]:
    store: Any = client._store  # the bench reads the store's identity as `tx=` does
    return store._identity  # type: ignore[no-any-return]


async def _timed(work: Callable[[], Awaitable[None]], n: int) -> float:
    began = time.perf_counter()
    await work()
    return (time.perf_counter() - began) / n * 1e6


async def bench(backend: str, n: int, repeats: int) -> list[str]:
    async with fresh_target(backend, "txsubmit") as target:  # type: ignore[arg-type]
        client = CairnQ.sqlite(target) if backend == "sqlite" else CairnQ.postgres(target)
        async with client:
            await _round(backend, client, target, 200)  # warm-up: connections, caches
            rounds = [await _round(backend, client, target, n) for _ in range(repeats)]
    ways = ("statement", "params", "tx", "standalone")
    med = {k: statistics.median(r[k] for r in rounds) for k in ways}
    return [
        backend,
        f"{n:,} x {repeats}",
        f"{med['statement']:.0f}",
        f"{med['params']:.0f}",
        f"{med['tx']:.0f}",
        f"{med['standalone']:.0f}",
        f"{med['tx'] / med['params']:.2f}",
        " ".join(f"{r['tx'] / r['params']:.2f}" for r in rounds),
    ]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgres"])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = [
        await bench(b, args.tasks, args.repeats) for b in args.backend or ["sqlite", "postgres"]
    ]
    print_table(
        "submit through the caller's transaction, µs per submit (medians)",
        [
            "backend",
            "submits",
            "statement",
            "statement + params",
            "tx=",
            "standalone",
            "tx= / (statement + params)",
            "rounds",
        ],
        rows,
    )


if __name__ == "__main__":
    main_entry(main)
