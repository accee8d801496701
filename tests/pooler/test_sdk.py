"""The SDK through a real PgBouncer, in transaction and session pool mode.

Without `pooler=`, psycopg's server-side prepared statements collide across clients
sharing a server connection (`prepared statement "_pg3_0" already exists`); with it,
connect (migrations included), submits, waits, calls and a worker all go through.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest

from cairnqd import CairnQ, Worker
from cairnqd.store.postgres import PostgresStore
from tests.pooler.conftest import Pooled


async def test_submit_wait_and_call_through_the_pooler(
    pooled: Pooled, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cairnqd.store")
    # Several clients share the pooler's few server connections, each preparing
    # nothing: run enough statements that psycopg would have prepared them (5 uses).
    clients = [CairnQ.postgres(pooled.pooled, pooler=pooled.mode, max_size=2) for _ in range(3)]
    for client in clients:
        await client.connect()
    worker = Worker.postgres(
        pooled.pooled, pooler=pooled.mode, concurrency=4, max_size=3, poll_interval_ms=50
    )

    @worker.task("pool.square")
    async def square(ctx: Any, payload: dict[str, int]) -> int:
        return payload["n"] ** 2

    try:
        async with worker.background():
            tasks = [
                await clients[n % 3].submit("pool.square", {"n": n}, key=f"k{n}") for n in range(30)
            ]
            done = await asyncio.gather(
                *(clients[n % 3].wait(t.id, timeout_ms=30_000) for n, t in enumerate(tasks))
            )
            assert [t.result for t in done] == [n * n for n in range(30)]
            assert await clients[1].call("pool.square", {"n": 12}, timeout_ms=30_000) == 144
            stats = await clients[2].stats()
            assert stats["default"]["succeeded"] == 31
    finally:
        for client in clients:
            await client.close()
    # Nothing prepared on the server behind the pooler.
    with psycopg.connect(pooled.direct) as conn:
        prepared = conn.execute("select count(*) from pg_prepared_statements").fetchone()
    assert prepared == (0,)
    if pooled.mode == "transaction":
        assert "push wake-ups off" in caplog.text


async def test_background_store_bounds_statements_with_set_local(pooled: Pooled) -> None:
    # The statement timeout reaches the server inside the transaction, not as a
    # startup option (PgBouncer refuses `options`, in session mode too).
    store = PostgresStore(pooled.pooled, pooler=pooled.mode, statement_timeout_ms=300)
    assert "statement_timeout" not in store.conninfo
    await store.connect()
    try:
        with pytest.raises(psycopg.errors.QueryCanceled):
            async with store._begun() as conn:
                await conn.execute("select pg_sleep(2)")
        assert await store.protocol_version() == 1
    finally:
        await store.close()


def test_schema_is_refused_behind_a_transaction_pooler() -> None:
    with pytest.raises(ValueError, match="search_path"):
        PostgresStore("postgresql://x@127.0.0.1/db", pooler="transaction", schema="s1")
    with pytest.raises(ValueError, match="pooler must be one of"):
        PostgresStore("postgresql://x@127.0.0.1/db", pooler="pgbouncer")


async def test_a_long_submit_many_streams_through_the_pooler(pooled: Pooled) -> None:
    # Long enough to be streamed: a clock reading, then a COPY (store/postgres/bulk.py), which
    # a transaction pooler must carry inside the one transaction.
    client = CairnQ.postgres(pooled.pooled, pooler=pooled.mode, max_size=2)
    async with client:
        tasks = await client.submit_many(
            [{"name": "pool.bulk", "payload": {"i": i}} for i in range(1200)]
        )
        assert [(await client.get(t.id)) for t in tasks[::97]] == tasks[::97]
        assert (await client.stats())["default"]["queued"] == 1200
