"""`submit(tx=...)`: a task written through the caller's own transaction exists exactly
when that transaction commits, on both dialects, with the real drivers (psycopg 3,
async and sync, and the stdlib's sqlite3).

Each test holds a business table (`orders`) beside the tasks, as an application does,
and checks what another connection sees before and after the caller's commit or
rollback: the task, its key row, and the order must agree.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cairnqd import AlreadyExists, CairnQ
from cairnqd.store.base import TaskStore
from cairnqd.store.postgres import PostgresStore
from cairnqd.worker import Worker
from tests.support.databases import PgDatabases, make_store
from tests.support.store import scalar
from tests.support.waiting import wait_for_async
from tests.support.worker import running


class Caller:
    """The application's side: its own connection to the database, with its own
    transaction, and an `orders` table of its own."""

    def __init__(self, dialect: str, conn: Any) -> None:
        self.dialect, self.conn = dialect, conn

    @classmethod
    async def open(cls, dialect: str, target: str, **options: Any) -> Caller:
        if dialect == "sqlite":
            conn: Any = sqlite3.connect(target, **options)
        else:
            conn = await psycopg.AsyncConnection.connect(target, **options)
        caller = cls(dialect, conn)
        await caller.run("create table if not exists orders (id integer primary key)")
        await caller.commit()
        return caller

    async def run(self, sql: str) -> None:
        if self.dialect == "sqlite":
            self.conn.execute(sql)
        else:
            await self.conn.execute(sql)

    async def commit(self) -> None:
        if self.dialect == "sqlite":
            self.conn.commit()
        else:
            await self.conn.commit()

    async def rollback(self) -> None:
        if self.dialect == "sqlite":
            self.conn.rollback()
        else:
            await self.conn.rollback()

    async def close(self) -> None:
        if self.dialect == "sqlite":
            self.conn.close()
        else:
            await self.conn.close()


@pytest.fixture
async def client(store: TaskStore) -> AsyncIterator[CairnQ]:
    yield CairnQ(store)


@pytest.fixture
async def caller(dialect: str, db_target: str, store: TaskStore) -> AsyncIterator[Caller]:
    del store  # migrated first, so the tables exist
    opened = await Caller.open(dialect, db_target)
    yield opened
    await opened.close()


def seen(dialect: str, target: str, sql: str) -> Any:
    """What a connection of nobody's transaction reads now."""
    return scalar(dialect, target, sql)


async def test_a_committed_transaction_has_its_task_and_a_rolled_back_one_has_none(
    client: CairnQ, caller: Caller, dialect: str, db_target: str
) -> None:
    await caller.run("insert into orders (id) values (1)")
    task = await client.submit("receipt.send", {"order": 1}, tx=caller.conn)
    assert await client.get(task.id) is None, "visible before the caller committed"
    await caller.commit()
    found = await client.get(task.id)
    assert found is not None and found.status == "queued" and found.payload == {"order": 1}

    await caller.run("insert into orders (id) values (2)")
    gone = await client.submit("receipt.send", {"order": 2}, key="receipt-2", tx=caller.conn)
    await caller.rollback()
    assert await client.get(gone.id) is None
    assert await client.get_by_key("receipt-2") is None
    assert seen(dialect, db_target, "select count(*) from cairnq_task_keys") == 0
    assert seen(dialect, db_target, "select count(*) from orders") == 1


async def test_an_exception_after_the_submit_leaves_nothing(
    client: CairnQ, caller: Caller, dialect: str, db_target: str
) -> None:
    async def place_order() -> None:
        await caller.run("insert into orders (id) values (7)")
        await client.submit_many(
            [{"name": "receipt.send", "payload": 7}, {"name": "stock.reserve", "key": "o-7"}],
            tx=caller.conn,
        )
        raise RuntimeError("the payment was declined")

    with pytest.raises(RuntimeError):
        try:
            await place_order()
        except BaseException:
            await caller.rollback()  # what the application's transaction block does
            raise
    assert seen(dialect, db_target, "select count(*) from cairnq_tasks") == 0
    assert seen(dialect, db_target, "select count(*) from cairnq_task_keys") == 0
    assert seen(dialect, db_target, "select count(*) from orders") == 0


async def test_keys_inside_a_transaction_behave_as_standalone_submits(
    client: CairnQ, caller: Caller
) -> None:
    earlier = await client.submit("receipt.send", key="receipt-9")
    reused = await client.submit("receipt.send", key="receipt-9", tx=caller.conn)
    assert reused.id == earlier.id
    first = await client.submit("receipt.send", key="receipt-10", tx=caller.conn)
    again = await client.submit("receipt.send", key="receipt-10", tx=caller.conn)
    assert again.id == first.id, "a second submit in the same transaction sees the first"
    await caller.run("insert into orders (id) values (10)")
    # A reject raises inside the caller's transaction, which stays usable.
    with pytest.raises(AlreadyExists):
        await client.submit("receipt.send", key="receipt-10", conflict="reject", tx=caller.conn)
    await caller.run("insert into orders (id) values (11)")
    await caller.commit()
    task = await client.get_by_key("receipt-10")
    assert task is not None and task.id == first.id


@pytest.mark.timing
async def test_a_worker_runs_the_task_after_the_commit_and_not_before(
    store: TaskStore, client: CairnQ, caller: Caller
) -> None:
    started = asyncio.Event()
    # A poll this slow would start the task seconds late: a start within a second of the
    # commit is the commit's wake-up (NOTIFY on Postgres, data_version on SQLite).
    worker = Worker(store, ["default"], poll_interval_ms=10_000)

    @worker.task("receipt.send")
    async def send(ctx: Any, payload: Any) -> str:
        started.set()
        return "sent"

    async with running(worker):
        task = await client.submit("receipt.send", {"order": 3}, tx=caller.conn)
        # A wake-up sent before the commit (or a task visible early) would start it now.
        await asyncio.sleep(0.5)
        assert not started.is_set(), "a worker ran a task its caller had not committed"
        await caller.commit()
        await asyncio.wait_for(started.wait(), 1.5)
        done = await wait_for_async(
            "the task to succeed",
            lambda: client.get(task.id),
            accept=lambda t: t is not None and t.status == "succeeded",
        )
        assert done is not None and done.result == "sent"


async def test_a_connection_to_another_database_is_refused_with_nothing_written(
    client: CairnQ, dialect: str, db_target: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if dialect == "sqlite":
        other_target = str(tmp_path / "other.db")
    else:
        other_target = request.getfixturevalue("pg_databases").new()
    other_store = make_store(dialect, other_target)
    await other_store.connect()  # a cairnq database too, only not this store's
    await other_store.close()
    other = await Caller.open(dialect, other_target)
    try:
        with pytest.raises(ValueError, match="this store's database") as caught:
            await client.submit("receipt.send", tx=other.conn)
        assert "would not commit with your work" in str(caught.value)
        await other.commit()
    finally:
        await other.close()
    assert seen(dialect, db_target, "select count(*) from cairnq_tasks") == 0
    assert seen(dialect, other_target, "select count(*) from cairnq_tasks") == 0


async def test_what_cannot_carry_a_task_is_refused_by_name(
    client: CairnQ, caller: Caller, dialect: str, db_target: str
) -> None:
    with pytest.raises(TypeError, match=r"got a builtins\.str"):
        await client.submit("receipt.send", tx="postgresql://elsewhere")
    with pytest.raises(TypeError, match=r"got a builtins\.object"):
        await client.submit_many([{"name": "receipt.send"}], tx=object())
    await caller.close()
    with pytest.raises(ValueError, match="closed"):
        await client.submit("receipt.send", tx=caller.conn)
    assert seen(dialect, db_target, "select count(*) from cairnq_tasks") == 0


@pytest.mark.postgres
async def test_a_failed_postgres_transaction_is_refused(
    pg_databases: PgDatabases,
) -> None:
    target = pg_databases.new()
    store = make_store("postgres", target)
    await store.connect()
    client = CairnQ(store)
    caller = await Caller.open("postgres", target)
    try:
        with pytest.raises(psycopg.errors.DivisionByZero):
            await caller.run("select 1 / 0")
        with pytest.raises(ValueError, match="failed transaction"):
            await client.submit("receipt.send", tx=caller.conn)
        await caller.rollback()
        # A sync psycopg connection writes the same way.
        with psycopg.connect(target) as sync:
            sync.execute("insert into orders (id) values (5)")
            task = await client.submit("receipt.send", key="r-5", tx=sync)
            assert await client.get(task.id) is None
        assert (await client.get(task.id)) is not None  # the with block committed
        # Autocommit outside a transaction: nothing to join, the submit commits alone.
        auto = await psycopg.AsyncConnection.connect(target, autocommit=True)
        try:
            alone = await client.submit("receipt.send", key="r-6", tx=auto)
            assert (await client.get(alone.id)) is not None
        finally:
            await auto.close()
    finally:
        await caller.close()
        await store.close()


async def test_sqlite_autocommit_and_implicit_transactions(
    tmp_path: Path,
) -> None:
    target = str(tmp_path / "tasks.db")
    store = make_store("sqlite", target)
    await store.connect()
    client = CairnQ(store)
    try:
        auto = sqlite3.connect(target, isolation_level=None)
        alone = await client.submit("receipt.send", key="a-1", tx=auto)
        assert (await client.get(alone.id)) is not None, "autocommit: committed at once"
        assert not auto.in_transaction
        auto.close()
        legacy = sqlite3.connect(target)
        task = await client.submit("receipt.send", tx=legacy)
        assert legacy.in_transaction, "left open for the caller's commit"
        assert (await client.get(task.id)) is None
        legacy.commit()
        assert (await client.get(task.id)) is not None
        legacy.close()
        with pytest.raises(ValueError, match="in-memory"):
            memory = make_store("sqlite", ":memory:")
            await memory.connect()
            try:
                await CairnQ(memory).submit("x", tx=sqlite3.connect(":memory:"))
            finally:
                await memory.close()
    finally:
        await store.close()


@pytest.mark.postgres
async def test_a_handler_completes_its_step_and_enqueues_the_next_atomically(
    pg_databases: PgDatabases,
) -> None:
    """`ctx.succeed_in` with `ctx.submit(..., tx=session)`: the next step exists if and
    only if this one's settlement committed. A pool of one connection, as a daemon
    child's: the write's own connection is the only one there is."""
    store = PostgresStore(pg_databases.new(), max_size=1)
    await store.connect()
    client = CairnQ(store)
    worker = Worker(store, ["default"], poll_interval_ms=50, retry_backoff_ms=10)
    attempts: list[int] = []

    @worker.task("step.one")
    async def one(ctx: Any, payload: Any) -> None:
        attempts.append(ctx.attempt)

        async def write(session: Any) -> str:
            await ctx.submit("step.two", {"from": ctx.task_id}, tx=session)
            if ctx.attempt == 1:
                raise RuntimeError("the settlement's transaction fails after the submit")
            return "done"

        await ctx.succeed_in(write)

    try:
        async with running(worker):
            first = await client.submit("step.one")
            done = await wait_for_async(
                "step one to succeed",
                lambda: client.get(first.id),
                accept=lambda t: t is not None and t.status == "succeeded",
            )
        assert done is not None and done.result == "done" and attempts == [1, 2]
        nexts = await client.list(name="step.two")
        assert [t.parent_id for t in nexts] == [first.id], "one next step, from attempt 2"
    finally:
        await store.close()
