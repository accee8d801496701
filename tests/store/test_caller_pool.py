"""`CairnQ.postgres(pool)`: a psycopg_pool the application owns carries the store's
statements, comes back configured as the application left it, and is never opened or
closed by the store, on a real Postgres.

The application's pool is set up unlike the store's on purpose: transactions (not
autocommit), tuple rows, and a JSON loader of its own.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import tuple_row
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from cairnqd import AlreadyExists, CairnQ, SchemaMismatch, TaskContext
from cairnqd.store.postgres import PostgresStore
from cairnqd.worker import Worker
from tests.support.worker import running

pytestmark = pytest.mark.postgres


def _app_loads(data: bytes | str) -> Any:
    """The application's own JSON decoding: objects come back wrapped, so a test can
    tell its loader from the store's."""
    return ("app", json.loads(data))


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    set_json_loads(_app_loads, conn)


@pytest.fixture
async def app_pool(pg_dsn: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        pg_dsn, min_size=1, max_size=4, open=False, configure=_configure, name="app"
    )
    await pool.open(wait=True)
    try:
        yield pool
    finally:
        await pool.close()


async def _as_the_app_left_it(pool: AsyncConnectionPool[Any]) -> None:
    """Every connection of the pool is still the application's: no autocommit, tuple
    rows, its own JSON loader; and it works."""
    for _ in range(pool.max_size):
        async with pool.connection() as conn:
            assert conn.autocommit is False
            assert conn.row_factory is tuple_row
            cursor = await conn.execute("""select '{"a": 1}'::jsonb, '[2]'::json""")
            assert await cursor.fetchone() == (("app", {"a": 1}), ("app", [2]))
            await conn.rollback()


async def test_the_store_runs_on_the_callers_pool_and_leaves_it_as_it_was(
    app_pool: AsyncConnectionPool[Any],
) -> None:
    client = CairnQ.postgres(app_pool)
    worker = Worker.postgres(app_pool, concurrency=2)

    @worker.task("double")
    async def double(ctx: TaskContext) -> dict[str, int]:
        return {"n": ctx.payload["n"] * 2}

    async with client, running(worker):
        tasks = [await client.submit("double", {"n": n}) for n in range(6)]
        results = [await client.wait(t.id, timeout_ms=30_000) for t in tasks]
        assert [r.result for r in results] == [{"n": 2 * n} for n in range(6)]
        listed = await client.list(status="succeeded")
        assert len(listed) == 6
        assert listed[0].payload is not None and "n" in listed[0].payload
    # Both the client and the worker closed their stores: the pool is still open.
    assert not app_pool.closed
    await _as_the_app_left_it(app_pool)
    # The store opens again on its next use, on the same pool.
    again = await client.get(tasks[0].id)
    assert again is not None and again.result == {"n": 0}
    await client.close()
    assert not app_pool.closed


async def test_a_submit_inside_the_apps_transaction_on_a_pool_connection(
    app_pool: AsyncConnectionPool[Any],
) -> None:
    async with CairnQ.postgres(app_pool) as client:
        async with app_pool.connection() as conn:
            task = await client.submit("later", {"x": 1}, tx=conn)
            await conn.rollback()
        assert await client.get(task.id) is None
        async with app_pool.connection() as conn:
            task = await client.submit("later", {"x": 1}, tx=conn)
        # The pool's context manager committed the application's transaction.
        stored = await client.get(task.id)
        assert stored is not None and stored.status == "queued"
    await _as_the_app_left_it(app_pool)


async def test_a_statement_that_fails_hands_the_connection_back_clean(
    app_pool: AsyncConnectionPool[Any],
) -> None:
    async with CairnQ.postgres(app_pool) as client:
        # A keyed reject fails inside the store's transaction, which is rolled back.
        await client.submit("k", key="one", conflict="reject")
        with pytest.raises(AlreadyExists, match="'one' already exists"):
            await client.submit("k", key="one", conflict="reject")
    await _as_the_app_left_it(app_pool)


async def test_schema_is_asserted_on_the_callers_connections(
    app_pool: AsyncConnectionPool[Any],
) -> None:
    # The pool's connections resolve to public; the store is told to expect another.
    store = PostgresStore(app_pool, schema="elsewhere")
    with pytest.raises(SchemaMismatch, match="elsewhere"):
        await store.connect()
    await store.close()
    assert not app_pool.closed


async def test_a_closed_pool_is_refused_with_what_to_do(pg_dsn: str) -> None:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(pg_dsn, open=False, name="shut")
    client = CairnQ.postgres(pool)
    with pytest.raises(RuntimeError, match=r"'shut' given as source is closed.*pool\.open\(\)"):
        await client.connect()
    assert pool.closed  # not opened behind the caller's back


async def test_connection_parameters_given_as_pool_kwargs_reach_the_stores_sessions(
    pg_dsn: str,
) -> None:
    # No conninfo at all: the pool connects from kwargs; the store's own sessions
    # (migrations, LISTEN) must find the same server from them.
    params = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        "", kwargs={**params, "autocommit": False}, min_size=1, max_size=3, open=False
    )
    await pool.open(wait=True)
    try:
        async with CairnQ.postgres(pool) as client:
            task = await client.submit("x", {"y": 1})
            assert (await client.get(task.id)) is not None
    finally:
        await pool.close()


@pytest.mark.parametrize(
    ("source", "said"),
    [
        (ConnectionPool("", open=False), "a sync pool cannot serve an asyncio store"),
        (object(), "pass a libpq DSN or a psycopg_pool.AsyncConnectionPool"),
        (
            type("Executor", (), {"query": lambda s: None, "transaction": lambda s: None})(),
            "takes no executor over another driver",
        ),
    ],
    ids=["sync-pool", "object", "executor"],
)
def test_an_unsupported_source_is_named(source: object, said: str) -> None:
    with pytest.raises(TypeError, match="source must be a DSN") as caught:
        CairnQ.postgres(source)  # type: ignore[arg-type]
    assert said in str(caught.value)
    assert type(source).__qualname__ in str(caught.value)


async def test_a_single_connection_is_refused(pg_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        with pytest.raises(TypeError, match="one connection cannot carry"):
            CairnQ.postgres(conn)  # type: ignore[arg-type]
