"""Concurrent keyed submits and concurrent claims (docs/protocol.md §3.6, §6.1, §6.2, §9.3).

Contention is real: several stores (each its own SQLite connection or Postgres pool) in
one event loop, and several processes released together by a barrier.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cairnqd.errors import AlreadyExists
from cairnqd.store.base import TaskStore
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore
from tests.support.store import query, run_together, scalar


def _stores(dialect: str, target: str, n: int) -> list[TaskStore]:
    if dialect == "sqlite":
        return [SQLiteStore(target) for _ in range(n)]
    return [PostgresStore(target, max_size=4) for _ in range(n)]


async def _open(stores: list[TaskStore]) -> None:
    for s in stores:
        await s.connect()


async def _close(stores: list[TaskStore]) -> None:
    await asyncio.gather(*(s.close() for s in stores))


# -- same-key submits --------------------------------------------------------------------


async def test_same_key_submits_from_many_tasks_collapse(dialect: str, db_target: str) -> None:
    stores = _stores(dialect, db_target, 4)
    await _open(stores)
    try:
        submits = [
            stores[i % 4].submit(name="dedupe", key="order-1", payload={"attempt": i})
            for i in range(40)
        ]
        tasks = await asyncio.gather(*submits)
    finally:
        await _close(stores)
    assert len({t.id for t in tasks}) == 1, Counter(t.id for t in tasks)
    assert {t.status for t in tasks} == {"queued"}
    assert scalar(dialect, db_target, "select count(*) from cairnq_tasks") == 1
    assert query(dialect, db_target, "select key, task_id from cairnq_task_keys") == [
        ("order-1", tasks[0].id)
    ]


async def test_concurrent_reject_admits_exactly_one(dialect: str, db_target: str) -> None:
    stores = _stores(dialect, db_target, 4)
    await _open(stores)
    try:
        outcomes = await asyncio.gather(
            *(
                stores[i % 4].submit(name="once", key="only-one", conflict="reject")
                for i in range(20)
            ),
            return_exceptions=True,
        )
    finally:
        await _close(stores)
    created = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(created) == 1
    assert all(isinstance(o, AlreadyExists) and o.key == "only-one" for o in refused), refused
    assert scalar(dialect, db_target, "select count(*) from cairnq_tasks") == 1


async def test_concurrent_replace_leaves_one_live_task(dialect: str, db_target: str) -> None:
    stores = _stores(dialect, db_target, 4)
    await _open(stores)
    try:
        tasks = await asyncio.gather(
            *(stores[i % 4].submit(name="latest", key="k", conflict="replace") for i in range(20))
        )
    finally:
        await _close(stores)
    statuses = Counter(r[0] for r in query(dialect, db_target, "select status from cairnq_tasks"))
    assert statuses == {"queued": 1, "canceled": 19}
    live = scalar(dialect, db_target, "select id from cairnq_tasks where status = 'queued'")
    assert query(dialect, db_target, "select task_id from cairnq_task_keys") == [(live,)]
    assert live in {t.id for t in tasks}


SAME_KEY_CHILD = """
import asyncio
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore
async def main():
    if ARGS["dialect"] == "sqlite":
        store = SQLiteStore(ARGS["target"])
    else:
        store = PostgresStore(ARGS["target"], max_size=4)
    await store.connect()
    barrier()
    try:
        tasks = await asyncio.gather(*(
            store.submit(name="dedupe", key=ARGS["key"], payload={"proc": ARGS["index"], "n": n})
            for n in range(10)
        ))
    finally:
        await store.close()
    emit([t.id for t in tasks])
asyncio.run(main())
"""


def test_same_key_submits_from_processes_collapse(
    dialect: str, db_target: str, tmp_path: Path
) -> None:
    if dialect == "sqlite":
        # Created up front so the children race on submits, not on migrations.
        asyncio.run(_create(SQLiteStore(db_target)))
    else:
        asyncio.run(_create(PostgresStore(db_target, max_size=1)))
    args = {"dialect": dialect, "target": db_target, "key": "shared-key"}
    results = run_together([SAME_KEY_CHILD] * 4, [args] * 4, tmp_path / "barrier")
    for r in results:
        assert r.returncode == 0, r.stderr
    ids = [task_id for r in results for task_id in r.result]
    assert len(ids) == 40
    assert len(set(ids)) == 1, Counter(ids)
    assert scalar(dialect, db_target, "select count(*) from cairnq_tasks") == 1
    assert query(dialect, db_target, "select key, task_id from cairnq_task_keys") == [
        ("shared-key", ids[0])
    ]


async def _create(store: TaskStore) -> None:
    await store.connect()
    await store.close()


# -- concurrent claims -------------------------------------------------------------------


def _stores(dialect: str, target: str, n: int) -> list[TaskStore]:
    """`n` stores on one database, each with a single connection of its own."""
    if dialect == "sqlite":
        return [SQLiteStore(target) for _ in range(n)]
    return [PostgresStore(target, max_size=1) for _ in range(n)]


async def _drain(store: TaskStore, worker: str) -> list[str]:
    """Claim until the queue has nothing queued left; limits vary so draws overlap."""
    got: list[str] = []
    for limit in itertools.cycle((1, 3, 2, 5)):
        batch = await store.claim(
            queues=["default"], worker_id=worker, lease_ms=600_000, limit=limit
        )
        for task in batch:
            assert (task.status, task.worker_id, task.attempt) == ("running", worker, 1)
        got.extend(t.id for t in batch)
        if not batch and await store.queue_depth("default", 1) == 1:
            return got
    raise AssertionError("unreachable")


def _assert_each_claimed_once(
    dialect: str, target: str, submitted: list[str], by_worker: dict[str, list[str]]
) -> None:
    claimed = [task_id for ids in by_worker.values() for task_id in ids]
    duplicates = [i for i, n in Counter(claimed).items() if n > 1]
    assert not duplicates, f"{len(duplicates)} tasks handed to two workers: {duplicates[:5]}"
    assert sorted(claimed) == sorted(submitted)
    rows = query(
        dialect,
        target,
        "select id, status, attempt, worker_id, name, created_at_ms, updated_at_ms"
        " from cairnq_tasks",
    )
    owner = {task_id: worker for worker, ids in by_worker.items() for task_id in ids}
    unknown = [r for r in rows if r[0] not in owner]
    assert not unknown, f"{len(rows)} rows, {len(unknown)} nobody claimed: {unknown[:5]}"
    for task_id, status, attempt, worker_id, *_ in rows:
        assert (status, attempt, worker_id) == ("running", 1, owner[task_id]), task_id


@pytest.mark.parametrize("n_workers", [8])
async def test_concurrent_claims_in_one_process(
    dialect: str, db_target: str, n_workers: int
) -> None:
    stores = _stores(dialect, db_target, n_workers)
    await _open(stores)
    try:
        submitted = await stores[0].submit_many(
            [{"name": "job", "payload": {"n": i}} for i in range(500)]
        )
        results = await asyncio.gather(*(_drain(s, f"worker-{i}") for i, s in enumerate(stores)))
    finally:
        await _close(stores)
    by_worker = {f"worker-{i}": ids for i, ids in enumerate(results)}
    _assert_each_claimed_once(dialect, db_target, [t.id for t in submitted], by_worker)
    # Every worker took part; a claim path that serialized everyone onto one worker
    # would still pass the uniqueness checks.
    if dialect == "postgres":
        assert sum(1 for ids in results if ids) >= 2


async def test_claims_racing_cancels_of_queued_tasks(dialect: str, db_target: str) -> None:
    """Cancels of queued tasks commit while claims draw (on Postgres, between a claim's
    snapshot and its row locks too): each task ends either canceled before any claim,
    never handed out, or claimed by exactly one worker and still running."""
    stores = _stores(dialect, db_target, 5)
    await _open(stores)
    try:
        tasks = await stores[0].submit_many([{"name": "job"} for _ in range(400)])
        # Every other task, in reverse order, so cancels meet the claims' front.
        doomed = [t.id for t in tasks[::-2]]

        async def cancel_all(store: TaskStore) -> list[str]:
            canceled: list[str] = []
            for task_id in doomed:
                task = await store.cancel(task_id)
                if task is not None and task.status == "canceled":
                    canceled.append(task_id)
            return canceled

        *claimed, canceled = await asyncio.gather(
            *(_drain(s, f"worker-{i}") for i, s in enumerate(stores[:4])),
            cancel_all(stores[4]),
        )
    finally:
        await _close(stores)
    handed_out = [task_id for ids in claimed for task_id in ids]
    assert len(handed_out) == len(set(handed_out)), "a task was handed to two workers"
    assert not set(handed_out) & set(canceled), "a canceled task was handed out"
    assert sorted(handed_out + canceled) == sorted(t.id for t in tasks)
    owner = {task_id: f"worker-{i}" for i, ids in enumerate(claimed) for task_id in ids}
    for task_id, status, attempt, worker_id in query(
        dialect, db_target, "select id, status, attempt, worker_id from cairnq_tasks"
    ):
        if task_id in owner:
            assert (status, attempt, worker_id) == ("running", 1, owner[task_id]), task_id
        else:
            assert (status, attempt) == ("canceled", 0), task_id


CLAIM_CHILD = """
import asyncio, itertools
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.sqlite import SQLiteStore
async def main():
    if ARGS["dialect"] == "sqlite":
        store = SQLiteStore(ARGS["target"])
    else:
        store = PostgresStore(ARGS["target"], max_size=1)
    await store.connect()
    worker = "proc-%d" % ARGS["index"]
    got = []
    barrier()
    try:
        for limit in itertools.cycle((1, 3, 2, 5)):
            batch = await store.claim(
                queues=["default"], worker_id=worker, lease_ms=600000, limit=limit
            )
            for task in batch:
                assert (task.status, task.worker_id, task.attempt) == ("running", worker, 1)
            got.extend(t.id for t in batch)
            if not batch and await store.queue_depth("default", 1) == 1:
                break
    finally:
        await store.close()
    emit({"worker": worker, "ids": got})
asyncio.run(main())
"""


async def _seed(dialect: str, target: str, n: int) -> list[str]:
    store = SQLiteStore(target) if dialect == "sqlite" else PostgresStore(target, max_size=1)
    await store.connect()
    try:
        tasks = await store.submit_many([{"name": "job", "payload": {"n": i}} for i in range(n)])
    finally:
        await store.close()
    return [t.id for t in tasks]


def test_concurrent_claims_across_processes(dialect: str, db_target: str, tmp_path: Path) -> None:
    submitted = asyncio.run(_seed(dialect, db_target, 400))
    args: dict[str, Any] = {"dialect": dialect, "target": db_target}
    results = run_together([CLAIM_CHILD] * 4, [args] * 4, tmp_path / "barrier")
    for r in results:
        assert r.returncode == 0, r.stderr
    by_worker = {r.result["worker"]: r.result["ids"] for r in results}
    _assert_each_claimed_once(dialect, db_target, submitted, by_worker)
