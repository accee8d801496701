"""`ctx.succeed_in(write)`: the handler's own writes and the task's settlement commit in
one Postgres transaction, or neither does."""

from __future__ import annotations

import psycopg
import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.errors import UnsupportedBackend
from cairnqd.store.base import TaskStore
from cairnqd.store.executor import UserSession
from cairnqd.worker import Worker
from tests.support.worker import POSTGRES_ONLY, SQLITE_ONLY, running, wait_status

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def orders_table(db_target: str) -> str:
    """The application's own table, on the store's database; its DSN."""
    with psycopg.connect(db_target, autocommit=True) as conn:
        conn.execute("create table orders (id text primary key, amount int not null)")
    return db_target


def _orders(dsn: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("select id, amount from orders order by id").fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


@POSTGRES_ONLY
async def test_the_handlers_writes_and_the_result_commit_together(
    store: TaskStore, client: CairnQ, orders_table: str
) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50)

    @worker.task
    async def record(ctx: TaskContext, payload: dict[str, int]) -> None:
        async def write(session: UserSession) -> dict[str, int]:
            await session.query(
                "insert into orders (id, amount) values ($1, $2)", [ctx.task_id, payload["n"]]
            )
            rows = await session.query("select count(*) as n from orders")
            return {"orders": int(rows[0]["n"])}

        await ctx.succeed_in(write)

    task = await client.submit("record", {"n": 42})
    async with running(worker):
        done = await wait_status(store, task.id, "succeeded")
    assert done.result == {"orders": 1}
    assert _orders(orders_table) == [(task.id, 42)]


@POSTGRES_ONLY
async def test_a_write_that_raises_leaves_neither_the_row_nor_a_success(
    store: TaskStore, client: CairnQ, orders_table: str
) -> None:
    worker = Worker(store, ["default"], poll_interval_ms=50)

    @worker.task
    async def record(ctx: TaskContext) -> None:
        async def write(session: UserSession) -> None:
            await session.query("insert into orders (id, amount) values ($1, 1)", [ctx.task_id])
            raise RuntimeError("the receipt could not be rendered")

        await ctx.succeed_in(write)

    task = await client.submit("record", None, max_attempts=1)
    async with running(worker):
        failed = await wait_status(store, task.id, "failed")
    assert failed.error is not None and "receipt" in str(failed.error.get("message"))
    assert _orders(orders_table) == []  # rolled back with the settlement


@SQLITE_ONLY
async def test_sqlite_says_it_cannot_share_the_transaction(store: TaskStore) -> None:
    async def write(session: UserSession) -> None:
        raise AssertionError("never called")

    with pytest.raises(UnsupportedBackend, match="needs a Postgres store"):
        await store.complete_in(task_id="task_x", worker_id="w", write=write)
