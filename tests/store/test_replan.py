"""A prepared statement's generic plan is made once, for the table as it was then. The
claim's, made while cairnq_tasks was nearly empty, scanned the whole table for every
claim once it had grown (store/postgres/store.py, `_begin_steps`): with autovacuum off
nothing ever had it planned again, and a worker under a steady stream slowed down as
the table filled. A real Postgres, the store's own prepared statements."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import pytest

from cairnqd.client import CairnQ
from cairnqd.store.postgres import PostgresStore
from tests.support.databases import PgDatabases, require_postgres

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]


@pytest.fixture
async def one_connection(pg_databases: PgDatabases) -> AsyncIterator[PostgresStore]:
    require_postgres()
    store = PostgresStore(pg_databases.new(), min_size=1, max_size=1)
    await store.connect()
    try:
        yield store
    finally:
        await store.close()


async def run_tasks(store: PostgresStore, n: int) -> None:
    for _ in range(n):
        await store.submit(name="job", queue="q")
        [task] = await store.claim(queues=["q"], worker_id="w")
        await store.complete(task_id=task.id, worker_id="w", result=None)


async def claim_plan(store: PostgresStore) -> str:
    """The plan the connection's prepared claim statement runs with now."""
    async with store._borrow() as conn:
        found = await conn.execute(
            "select name from pg_prepared_statements where statement like %s",
            ["%ctid = any(array(%"],
        )
        [row] = await found.fetchall()
        explained = await conn.execute(
            f"explain (costs off) execute {row['name']}('w', 30000, 'q', null, 1)"
        )
        return "\n".join(line["QUERY PLAN"] for line in await explained.fetchall())


async def test_the_claim_is_planned_again_for_a_table_that_grew(
    one_connection: PostgresStore,
) -> None:
    store = one_connection
    store.replan_first_s = store.replan_every_s = math.inf
    # psycopg prepares a statement at its fifth run, Postgres makes its generic plan
    # after five more: on a table of a dozen rows, a sequential scan.
    await run_tasks(store, 12)
    assert "Seq Scan on cairnq_tasks\n" in await claim_plan(store) + "\n"
    await CairnQ(store).submit_many([{"name": "job", "queue": "elsewhere"}] * 3000)
    await run_tasks(store, 3)
    assert "Seq Scan on cairnq_tasks\n" in await claim_plan(store) + "\n", "planned again"

    store.replan_first_s = store.replan_every_s = 0.0  # the next BEGIN drops the plans
    await run_tasks(store, 12)
    plan = await claim_plan(store)
    assert "Tid Scan on cairnq_tasks" in plan, plan


def test_a_new_connection_plans_again_soon_then_less_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plan made on the table a connection first saw does not last: its first replan
    comes after `replan_first_s`, the next ones twice as far apart, up to
    `replan_every_s`."""
    store = PostgresStore("dbname=unused")
    store.replan_first_s, store.replan_every_s = 0.5, 5.0
    clock = [100.0]
    monkeypatch.setattr("cairnqd.store.postgres.store.time.monotonic", lambda: clock[0])

    class Conn:
        pass

    conn = Conn()
    replanned = []
    for tick in range(200):  # 20 s, a BEGIN every 0.1 s
        clock[0] = 100.0 + tick / 10
        if store._begin_steps(conn) == ("discard plans", "begin"):  # type: ignore[arg-type]
            replanned.append(round(clock[0] - 100.0, 1))
    assert replanned == [0.5, 1.5, 3.5, 7.5, 12.5, 17.5]
