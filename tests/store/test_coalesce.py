"""Concurrent keyless submits share statements (store/coalesce.py) on Postgres and on
SQLite, and each caller still gets its own task or its own error; keyed submits keep
their conflict rules.

The failures are real: a trigger in the test database refuses or delays chosen rows.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import psycopg
import pytest

from cairnqd.models import Task
from cairnqd.store.base import TaskStore
from cairnqd.store.coalesce import SubmitCoalescer
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore
from tests.support.store import query

# Rows named "poison" are refused; rows named "slow" take a moment to insert.
TRIGGER = """
create or replace function test_refuse_poison() returns trigger language plpgsql as $$
begin
    if new.name = 'poison' then
        raise exception 'poison refused for %', new.id;
    end if;
    if new.name = 'slow' then
        perform pg_sleep(0.5);
    end if;
    return new;
end $$;
create trigger test_refuse_poison before insert on cairnq_tasks
    for each row execute function test_refuse_poison();
"""


@pytest.fixture
async def pg(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    store = PostgresStore(pg_dsn)
    async with store:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(TRIGGER)
        yield store


def rows_named(dsn: str, name: str) -> list[tuple[str, object]]:
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "select id, payload from cairnq_tasks where name = %s order by id", (name,)
        ).fetchall()
    return [(str(i), p) for i, p in found]


async def test_concurrent_submits_share_statements_and_each_lands_once(
    pg: PostgresStore, pg_dsn: str
) -> None:
    before = pg.submits.statements
    tasks = await asyncio.gather(*(pg.submit(name="n", payload={"i": i}) for i in range(64)))
    assert [t.payload for t in tasks] == [{"i": i} for i in range(64)]
    assert len({t.id for t in tasks}) == 64
    stored = dict(rows_named(pg_dsn, "n"))
    assert stored == {t.id: t.payload for t in tasks}
    statements = pg.submits.statements - before
    assert statements < 16, f"64 concurrent submits took {statements} statements"
    # What a batch hands back is what a single insert would have.
    again = await pg.get(tasks[-1].id)
    assert again is not None
    assert (again.status, again.attempt, again.run_at_ms) == ("queued", 0, tasks[-1].run_at_ms)


async def test_callers_submitting_in_a_loop_share_one_statement_a_round(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    """A web application's pattern: 64 coroutines, each awaiting one submit after
    another. After the first round each round is one statement (and one commit), not a
    one-row write by whichever caller came back first and then a batch of the rest."""
    assert isinstance(store, PostgresStore | SQLiteStore)
    before = store.submits.statements

    async def caller(c: int) -> list[Task]:
        return [await store.submit(name="loop", payload=[c, i]) for i in range(10)]

    per_caller = await asyncio.gather(*(caller(c) for c in range(64)))
    statements = store.submits.statements - before
    assert statements <= 12, f"10 rounds of 64 submits took {statements} statements"
    rows = query(dialect, db_target, "select id, payload from cairnq_tasks where name = 'loop'")
    stored = {i: json.loads(p) if isinstance(p, str) else p for i, p in rows}
    assert stored == {t.id: t.payload for tasks in per_caller for t in tasks}
    assert len(stored) == 640


async def test_sequential_submits_are_written_one_by_one(pg: PostgresStore) -> None:
    before = pg.submits.statements
    for i in range(5):
        await pg.submit(name="n", payload=i)
    assert pg.submits.statements - before == 5


async def test_a_refused_submit_fails_alone(pg: PostgresStore, pg_dsn: str) -> None:
    names = ["n"] * 31 + ["poison"] + ["n"] * 32
    outcomes = await asyncio.gather(
        *(pg.submit(name=name, payload={"i": i}) for i, name in enumerate(names)),
        return_exceptions=True,
    )
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(failed) == 1 and "poison refused" in str(failed[0])
    assert isinstance(outcomes[31], BaseException)
    landed = [o for o in outcomes if isinstance(o, Task)]
    assert sorted(t.id for t in landed) == [i for i, _ in rows_named(pg_dsn, "n")]
    assert rows_named(pg_dsn, "poison") == []


async def test_a_submit_cancelled_while_queued_never_lands(pg: PostgresStore, pg_dsn: str) -> None:
    before = pg.submits.statements
    slow = asyncio.create_task(pg.submit(name="slow"))
    # Wait (with a deadline) until the slow insert is being written: the next ones queue.
    async with asyncio.timeout(10):
        while pg.submits.statements == before:  # noqa: ASYNC110 - a counter, no event to wait on
            await asyncio.sleep(0)
    cancelled = asyncio.create_task(pg.submit(name="n", payload="cancelled"))
    kept = asyncio.create_task(pg.submit(name="n", payload="kept"))
    await asyncio.sleep(0)  # both have taken their first step: they are queued
    assert not slow.done()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await slow
    assert (await kept).payload == "kept"
    assert [p for _, p in rows_named(pg_dsn, "n")] == ["kept"]


async def test_close_writes_what_was_queued(pg_dsn: str) -> None:
    store = PostgresStore(pg_dsn)
    await store.connect()
    pending = [asyncio.create_task(store.submit(name="n", payload=i)) for i in range(20)]
    await asyncio.sleep(0)  # queued, not yet written
    await store.close()
    assert sorted(t.payload for t in await asyncio.gather(*pending)) == list(range(20))
    assert len(rows_named(pg_dsn, "n")) == 20


async def test_concurrent_keyed_submits_keep_their_conflict_rules(pg: PostgresStore) -> None:
    reused = await asyncio.gather(*(pg.submit(name="k", key="one", payload=i) for i in range(20)))
    assert len({t.id for t in reused}) == 1
    replaced = await pg.submit(name="k", key="one", conflict="replace", payload="new")
    assert replaced.id != reused[0].id
    old = await pg.get(reused[0].id)
    assert old is not None and old.status == "canceled"


# -- SQLite: the same sharing in front of the store's group commit ------------------

SQLITE_TRIGGER = """
create trigger test_refuse_poison before insert on cairnq_tasks
    when new.name = 'poison'
begin
    select raise(abort, 'poison refused');
end;
"""


@pytest.fixture
async def lite(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "tasks.db")
    async with store:
        await store.connect()
        with sqlite3.connect(store.path) as conn:
            conn.executescript(SQLITE_TRIGGER)
        yield store


def sqlite_rows_named(path: str, name: str) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as conn:
        found = conn.execute(
            "select id, payload from cairnq_tasks where name = ? order by id", (name,)
        ).fetchall()
    return [(str(i), str(p)) for i, p in found]


async def test_sqlite_concurrent_submits_share_statements_and_each_lands_once(
    lite: SQLiteStore,
) -> None:
    before = lite.submits.statements
    tasks = await asyncio.gather(*(lite.submit(name="n", payload={"i": i}) for i in range(64)))
    assert [t.payload for t in tasks] == [{"i": i} for i in range(64)]
    stored = dict(sqlite_rows_named(lite.path, "n"))
    assert stored == {t.id: f'{{"i":{i}}}' for i, t in enumerate(tasks)}
    statements = lite.submits.statements - before
    assert statements < 16, f"64 concurrent submits took {statements} statements"
    again = await lite.get(tasks[-1].id)
    assert again is not None
    assert (again.status, again.attempt, again.run_at_ms) == ("queued", 0, tasks[-1].run_at_ms)
    assert again.created_at_ms == tasks[-1].created_at_ms


async def test_sqlite_a_refused_submit_fails_alone(lite: SQLiteStore) -> None:
    names = ["n"] * 31 + ["poison"] + ["n"] * 32
    outcomes = await asyncio.gather(
        *(lite.submit(name=name, payload={"i": i}) for i, name in enumerate(names)),
        return_exceptions=True,
    )
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(failed) == 1 and "poison refused" in str(failed[0])
    assert isinstance(outcomes[31], BaseException)
    landed = [o for o in outcomes if isinstance(o, Task)]
    assert sorted(t.id for t in landed) == [i for i, _ in sqlite_rows_named(lite.path, "n")]
    assert sqlite_rows_named(lite.path, "poison") == []


async def test_sqlite_close_writes_what_was_queued(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "tasks.db")
    await store.connect()
    pending = [asyncio.create_task(store.submit(name="n", payload=i)) for i in range(20)]
    await asyncio.sleep(0)  # queued, not yet written
    await store.close()
    assert sorted(t.payload for t in await asyncio.gather(*pending)) == list(range(20))
    assert len(sqlite_rows_named(str(tmp_path / "tasks.db"), "n")) == 20
    assert store.submits.statements < 20  # they were shared, and still all landed


# -- the coalescer's own rules, with insert functions standing in for a database -----


async def test_a_transient_batch_error_reaches_every_caller_at_once() -> None:
    calls: list[int] = []
    gate = asyncio.Event()

    async def one(params: dict[str, object]) -> Task:
        calls.append(1)
        await gate.wait()  # hold the first write so that the rest form a batch
        raise psycopg.OperationalError("server closed the connection")

    async def many(batch: Sequence[dict[str, object]]) -> list[Task]:
        calls.append(len(batch))
        raise psycopg.OperationalError("server closed the connection")

    coalescer = SubmitCoalescer(one, many)
    first = asyncio.create_task(coalescer.submit({"i": 0}))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(coalescer.submit({"i": i})) for i in range(1, 10)]
    await asyncio.sleep(0)
    gate.set()
    outcomes = await asyncio.gather(first, *rest, return_exceptions=True)
    assert all(isinstance(o, psycopg.OperationalError) for o in outcomes)
    # One single write, one batch write: no retry of each item against a dead server.
    assert calls == [1, 9]


async def test_callers_that_submit_again_join_the_next_batch() -> None:
    written: list[int] = []

    async def one(params: dict[str, object]) -> Task:
        written.append(1)
        await asyncio.sleep(0)  # a write takes at least a turn of the loop
        return object()  # type: ignore[return-value]

    async def many(batch: Sequence[dict[str, object]]) -> list[Task]:
        written.append(len(batch))
        await asyncio.sleep(0)
        return [object() for _ in batch]  # type: ignore[misc]

    coalescer = SubmitCoalescer(one, many)

    async def caller() -> None:
        for i in range(10):
            await coalescer.submit({"i": i})

    await asyncio.gather(*(caller() for _ in range(64)))
    assert sum(written) == 640
    # The first round is a lone write and a batch of the other 63; each later round
    # is one batch of 64.
    assert len(written) <= 12, written


async def test_a_lone_submit_is_written_by_its_caller_and_drain_waits_for_it() -> None:
    """Sequential submits skip the writer task (three loop turns each on the hot path);
    submits that arrive meanwhile wait for the lone write, then go as one batch, and
    `drain` (the store's close) waits for the lone write too."""
    written: list[object] = []
    gate = asyncio.Event()
    writer_names: list[str] = []

    async def one(params: dict[str, object]) -> Task:
        writer_names.append(asyncio.current_task().get_name())  # type: ignore[union-attr]
        await gate.wait()
        written.append(params["i"])
        return object()  # type: ignore[return-value]

    async def many(batch: Sequence[dict[str, object]]) -> list[Task]:
        written.append([p["i"] for p in batch])
        return [object() for _ in batch]  # type: ignore[misc]

    coalescer = SubmitCoalescer(one, many)
    first = asyncio.create_task(coalescer.submit({"i": 0}), name="caller-0")
    await asyncio.sleep(0)
    rest = [asyncio.create_task(coalescer.submit({"i": i})) for i in (1, 2, 3)]
    drained = asyncio.create_task(coalescer.drain())
    await asyncio.sleep(0)
    assert written == [] and not drained.done()
    gate.set()
    await asyncio.wait_for(drained, 10)
    # drain returned only once the lone write and the batch queued behind it landed.
    assert written == [0, [1, 2, 3]]
    assert writer_names == ["caller-0"]  # written in the caller's own task
    await asyncio.gather(first, *rest)
    assert (coalescer.statements, coalescer.submits) == (2, 4)
