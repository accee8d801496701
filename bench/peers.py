"""Enqueueing and counting for the Postgres peers (procrastinate, pgqueuer).

Each peer installs its own schema into the fresh database first. Both are optional:
`available()` says which can be imported.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from bench.common import NOOP, QUEUE

PEERS = ("procrastinate", "pgqueuer")

# Rows not finished yet, per peer: procrastinate keeps jobs with a status (todo, doing,
# succeeded, ...); pgqueuer deletes a job from its queue table once it has logged it.
PENDING_SQL = {
    "procrastinate": "select count(*) from procrastinate_jobs where status in ('todo', 'doing')",
    "pgqueuer": "select count(*) from pgqueuer",
}


def available(peer: str) -> bool:
    return importlib.util.find_spec(peer) is not None


async def _noop(**_: Any) -> None:
    return None


@asynccontextmanager
async def enqueuer(
    peer: str, dsn: str
) -> AsyncIterator[tuple[Callable[[int], Awaitable[None]], Callable[[int], Awaitable[None]]]]:
    """Install the peer's schema, then yield (submit_one(i), submit_batch(size))."""
    if peer == "procrastinate":
        import procrastinate

        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
        task = app.task(name=NOOP, queue=QUEUE)(_noop)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

            async def one(i: int) -> None:
                await task.defer_async(i=i)

            async def many(size: int) -> None:
                jobs: list[dict[str, Any]] = [{"i": i} for i in range(size)]
                await task.batch_defer_async(*jobs)

            yield one, many
        return
    if peer == "pgqueuer":
        import asyncpg
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(dsn)
        try:
            queries = Queries.from_asyncpg_connection(conn)
            await queries.install()

            async def one_pgq(i: int) -> None:
                await queries.enqueue(NOOP, json.dumps({"i": i}).encode())

            async def many_pgq(size: int) -> None:
                payloads: list[bytes | None] = [json.dumps({"i": i}).encode() for i in range(size)]
                await queries.enqueue([NOOP] * size, payloads, [0] * size)

            yield one_pgq, many_pgq
        finally:
            await conn.close()
        return
    raise ValueError(f"unknown peer {peer!r}")


async def preload(peer: str, dsn: str, n: int, chunk: int = 1000) -> float:
    """Enqueue `n` no-op jobs in batches of `chunk`; returns seconds spent enqueueing."""
    async with enqueuer(peer, dsn) as (_, many):
        start = time.perf_counter()
        for offset in range(0, n, chunk):
            await many(min(chunk, n - offset))
        return time.perf_counter() - start
