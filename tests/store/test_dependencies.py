"""Task dependencies in the store (docs/workflows.md), on both dialects: a task
submitted `after` others waits, queued but never due, until every parent succeeded;
a failed or canceled ancestor cancels the whole waiting graph below it, and a retry of
that ancestor brings it back; purge keeps what a waiting task still needs."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cairnqd.models import Task
from cairnqd.store.base import TaskStore
from cairnqd.store.dependencies import WAITING_RUN_AT, is_waiting
from tests.support.databases import make_store
from tests.support.store import scalar
from tests.support.waiting import wait_for_async

_BOOM = {"type": "E", "code": "boom", "message": "no", "retryable": False, "details": {}}


async def _run(store: TaskStore, *, name: str | None = None) -> list[str]:
    """Claim everything claimable now (one worker), in claim order; the ids."""
    tasks = await store.claim(
        queues=["default"], worker_id="w1", limit=100, names=None if name is None else [name]
    )
    return sorted(t.id for t in tasks)


async def _succeed(store: TaskStore, task: Task, result: Any = None) -> None:
    """Claim `task` alone (by its name, which the caller keeps unique) and complete it."""
    [claimed] = await store.claim(queues=["default"], worker_id="w1", limit=1, names=[task.name])
    assert claimed.id == task.id
    await store.complete(task_id=claimed.id, worker_id="w1", result=result)


async def _get(store: TaskStore, task: Task) -> Task:
    found = await store.get(task.id)
    assert found is not None
    return found


async def test_a_chain_runs_in_order(store: TaskStore) -> None:
    a = await store.submit(name="a")
    b = await store.submit(name="b", after=[a])
    c = await store.submit(name="c", after=[b.id])
    assert is_waiting(b) and is_waiting(c)
    assert (await _get(store, b)).run_at_ms == WAITING_RUN_AT
    assert await store.waiting_counts() == {"default": 2}

    claimed = await store.claim(queues=["default"], worker_id="w1", limit=10)
    assert [t.id for t in claimed] == [a.id], "only the head of the chain is due"
    await store.complete(task_id=a.id, worker_id="w1", result={"a": 1})
    b_now = await _get(store, b)
    assert b_now.status == "queued" and b_now.run_at_ms < WAITING_RUN_AT
    claimed = await store.claim(queues=["default"], worker_id="w1", limit=10)
    assert [t.id for t in claimed] == [b.id]
    await store.complete(task_id=b.id, worker_id="w1", result={"b": 2})
    claimed = await store.claim(queues=["default"], worker_id="w1", limit=10)
    assert [t.id for t in claimed] == [c.id]
    assert [t.result for t in await store.dependencies(c.id)] == [{"b": 2}]
    assert await store.waiting_counts() == {}


async def test_a_fan_in_waits_for_every_parent_and_keeps_its_order(store: TaskStore) -> None:
    parents = [await store.submit(name="map", payload={"i": i}) for i in range(3)]
    reduce = await store.submit(name="reduce", after=list(reversed(parents)), delay_ms=0)
    claimed = await store.claim(queues=["default"], worker_id="w1", limit=10)
    assert {t.id for t in claimed} == {p.id for p in parents}
    for p in parents[:2]:
        await store.complete(task_id=p.id, worker_id="w1", result=p.payload)
        assert is_waiting(await _get(store, reduce))
    await store.complete(task_id=parents[2].id, worker_id="w1", result=parents[2].payload)
    assert [t.id for t in await store.claim(queues=["default"], worker_id="w1", limit=10)] == [
        reduce.id
    ]
    deps = await store.dependencies(reduce.id)
    assert [t.id for t in deps] == [p.id for p in reversed(parents)]
    assert [t.result for t in deps] == [{"i": 2}, {"i": 1}, {"i": 0}]


async def test_a_diamond_releases_its_join_once_when_both_sides_succeeded(
    store: TaskStore,
) -> None:
    a, b, c, d = await store.submit_many(
        [
            {"name": "a"},
            {"name": "b", "after": [0]},
            {"name": "c", "after": [0]},
            {"name": "d", "after": [1, 2]},
        ]
    )
    assert not is_waiting(a) and all(is_waiting(t) for t in (b, c, d))
    await _succeed(store, a, {"a": 1})
    assert await _run(store) == sorted([b.id, c.id]), "both sides are due, the join is not"
    await store.complete(task_id=c.id, worker_id="w1", result={"c": 3})
    assert is_waiting(await _get(store, d)), "one side left"
    assert await _run(store) == []
    await store.complete(task_id=b.id, worker_id="w1", result={"b": 2})
    released = await _get(store, d)
    settled_b = await _get(store, b)
    assert released.status == "queued" and released.run_at_ms == settled_b.updated_at_ms
    assert await _run(store) == [d.id]
    assert await _run(store) == [], "released once"
    assert [t.result for t in await store.dependencies(d.id)] == [{"b": 2}, {"c": 3}]
    assert [t.id for t in await store.dependents(a.id)] == [b.id, c.id]
    assert [t.id for t in await store.dependents(a.id, limit=1)] == [b.id]
    assert await store.count_dependents(a.id) == 2 and await store.count_dependents(d.id) == 0


async def test_a_thousand_wide_fan_in_is_released_exactly_at_its_last_parent(
    store: TaskStore,
) -> None:
    width = 1_000
    items: list[dict[str, Any]] = [{"name": "part", "payload": {"i": i}} for i in range(width)]
    items.append({"name": "merge", "after": list(range(width))})
    *_, merge = await store.submit_many(items)
    assert await store.waiting_counts() == {"default": 1}
    claimed = await store.claim(queues=["default"], worker_id="w1", limit=width + 1)
    assert len(claimed) == width and merge.id not in {t.id for t in claimed}
    # All but one settle, in an order that is neither submit order nor its reverse.
    order = sorted(claimed, key=lambda t: (t.payload["i"] * 7919) % width)
    last, rest = order[-1], order[:-1]
    for start in range(0, len(rest), 100):
        await asyncio.gather(
            *(
                store.complete(task_id=t.id, worker_id="w1", result=t.payload["i"])
                for t in rest[start : start + 100]
            )
        )
    assert is_waiting(await _get(store, merge)), "999 of 1,000 parents is not enough"
    assert await _run(store) == []
    await store.complete(task_id=last.id, worker_id="w1", result=last.payload["i"])
    released = await _get(store, merge)
    assert released.run_at_ms == (await _get(store, last)).updated_at_ms
    assert await _run(store) == [merge.id]
    assert await _run(store) == [], "released once"
    results = [t.result for t in await store.dependencies(merge.id)]
    assert results == list(range(width)), "parents read back in the order named"
    assert await store.waiting_counts() == {}


async def test_a_succeeded_parent_does_not_hold_and_a_missing_one_is_refused(
    store: TaskStore,
) -> None:
    done = await store.submit(name="a")
    await _succeed(store, done)
    free = await store.submit(name="b", after=[done])
    assert not is_waiting(free) and free.status == "queued"
    assert [t.id for t in await store.claim(queues=["default"], worker_id="w1", limit=5)] == [
        free.id
    ]
    before = len(await store.list(limit=1000))
    refused = r"after names task_nope, which is not a task \(never submitted, or purged\)"
    with pytest.raises(ValueError, match=refused):
        await store.submit(name="c", after=[done.id, "task_nope"])
    assert len(await store.list(limit=1000)) == before, "nothing was written"
    with pytest.raises(TypeError, match="after must be a list"):
        await store.submit(name="c", after=done.id)  # type: ignore[arg-type]


async def test_a_failed_parent_cancels_the_whole_downstream_graph(store: TaskStore) -> None:
    a = await store.submit(name="a", max_attempts=1)
    other = await store.submit(name="other")
    b = await store.submit(name="b", after=[a, other])
    c = await store.submit(name="c", after=[b])
    d = await store.submit(name="d", after=[other])
    await store.claim(queues=["default"], worker_id="w1", limit=10)
    await store.fail(task_id=a.id, worker_id="w1", error=_BOOM, retryable=False)
    for t in (b, c):
        now = await _get(store, t)
        assert now.status == "canceled" and now.completed_at_ms is not None
        assert now.error is not None and now.error["code"] == "dependency_failed"
        assert a.id in now.error["message"] and now.error["details"]["dependency"] == a.id
    assert is_waiting(await _get(store, d)), "a task on another branch keeps waiting"
    assert (await _get(store, other)).status == "running", "parents are never touched"
    # A task submitted after a canceled one is canceled at once, naming the root cause.
    e = await store.submit(name="e", after=[c])
    assert e.status == "canceled" and e.error is not None
    assert e.error["details"]["dependency"] == a.id

    # Retry brings every task the failure canceled back to waiting.
    retried = await store.retry(a.id)
    assert retried is not None
    for t in (b, c, e):
        now = await _get(store, t)
        assert is_waiting(now) and now.error is None and now.completed_at_ms is None
    await _succeed(store, a)
    assert is_waiting(await _get(store, b)), "b still waits for `other`"
    await store.complete(task_id=other.id, worker_id="w1", result=None)
    claimed = await store.claim(queues=["default"], worker_id="w1", limit=10)
    assert {t.id for t in claimed} == {b.id, d.id}


async def test_retry_leaves_canceled_what_another_failed_ancestor_holds(store: TaskStore) -> None:
    a = await store.submit(name="a", max_attempts=1)
    x = await store.submit(name="x")
    b = await store.submit(name="b", after=[a, x])
    await store.cancel(x.id)  # a queued parent canceled: b goes at once
    assert (await _get(store, b)).error["details"]["dependency"] == x.id  # type: ignore[index]
    await store.claim(queues=["default"], worker_id="w1", limit=10)
    await store.fail(task_id=a.id, worker_id="w1", error=_BOOM, retryable=False)
    await store.retry(x.id)
    now = await _get(store, b)
    assert now.status == "canceled", "a has failed too: b stays canceled"
    assert now.error is not None and now.error["details"]["dependency"] == a.id, "named anew"
    await store.retry(a.id)
    assert is_waiting(await _get(store, b))


async def test_a_waiting_task_canceled_by_hand_cancels_its_dependents(store: TaskStore) -> None:
    a = await store.submit(name="a")
    b = await store.submit(name="b", after=[a])
    c = await store.submit(name="c", after=[b])
    canceled = await store.cancel(b.id)
    assert canceled is not None and canceled.status == "canceled"
    assert (await _get(store, c)).status == "canceled"
    assert (await _get(store, a)).status == "queued"
    # Retried by hand, b waits again for a, and c with it.
    retried = await store.retry(b.id)
    assert retried is not None and is_waiting(retried), "retry returns the task as it is"
    assert is_waiting(await _get(store, b)) and is_waiting(await _get(store, c))
    assert await _run(store) == [a.id]


async def test_submit_many_takes_a_graph_by_index(store: TaskStore) -> None:
    root = await store.submit(name="root")
    tasks = await store.submit_many(
        [
            {"name": "split", "after": [root]},
            {"name": "map", "payload": {"i": 0}, "after": [0]},
            {"name": "map", "payload": {"i": 1}, "after": [0]},
            {"name": "reduce", "after": [1, 2, root.id]},
        ]
    )
    assert all(is_waiting(t) for t in tasks)
    order: list[str] = []
    for _ in range(5):
        claimed = await store.claim(queues=["default"], worker_id="w1", limit=10)
        order += [t.name for t in sorted(claimed, key=lambda t: t.name)]
        for t in claimed:
            await store.complete(task_id=t.id, worker_id="w1", result=t.payload)
    assert order == ["root", "split", "map", "map", "reduce"]
    deps = await store.dependencies(tasks[3].id)
    assert [t.id for t in deps] == [tasks[1].id, tasks[2].id, root.id]


@pytest.mark.parametrize(
    ("after", "error", "match"),
    [
        ([1], ValueError, r"tasks\[1\]\.after\[0\] refers to tasks\[1\]"),
        ([5], ValueError, r"tasks\[1\]\.after\[0\] refers to tasks\[5\]"),
        ([-1], ValueError, r"tasks\[1\]\.after\[0\] refers to tasks\[-1\]"),
        (["task_nope"], ValueError, r"tasks\[1\]\.after\[0\] names task_nope, which is not"),
        ("task_x", TypeError, r"tasks\[1\]\.after must be a list"),
    ],
)
async def test_submit_many_refuses_bad_refs_and_writes_nothing(
    store: TaskStore, after: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        await store.submit_many([{"name": "a"}, {"name": "b", "after": after}])
    assert await store.list(limit=10) == []
    assert await store.waiting_counts() == {}


async def test_purge_keeps_a_parent_a_waiting_task_needs(store: TaskStore) -> None:
    a = await store.submit(name="a")
    b = await store.submit(name="b")
    c = await store.submit(name="c", after=[a, b])
    await _succeed(store, a)
    loose = await store.submit(name="z")
    await _succeed(store, loose)
    # Once `loose` (finished after a) is purgeable, a would be too, but for c.
    await wait_for_async("z purgeable", store.count_purgeable, accept=lambda n: n == 1)
    assert await store.purge() == [loose.id], "c still waits on b: a is kept for its result"
    await _succeed(store, b)
    claimed = await store.claim(queues=["default"], worker_id="w1", limit=5)
    await store.complete(task_id=claimed[0].id, worker_id="w1", result=None)
    # A task finished this very millisecond is not purgeable yet (the cut-off is strict).
    await wait_for_async("all three purgeable", store.count_purgeable, accept=lambda n: n == 3)
    assert sorted(await store.purge()) == sorted([a.id, b.id, c.id])
    assert await store.dependencies(c.id) == []


async def _caller_connection(dialect: str, target: str) -> Any:
    if dialect == "sqlite":
        return sqlite3.connect(target)
    return await psycopg.AsyncConnection.connect(target)


async def _end(dialect: str, conn: Any, how: str) -> None:
    result = getattr(conn, how)()
    if dialect != "sqlite":
        await result


async def test_after_through_the_callers_transaction(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    parent = await store.submit(name="a")
    conn = await _caller_connection(dialect, db_target)
    try:
        child = await store.submit(name="b", after=[parent], tx=conn)
        graph = await store.submit_many(
            [{"name": "c", "after": [child.id]}, {"name": "d", "after": [0, parent.id]}], tx=conn
        )
        assert await store.get(child.id) is None, "visible before the caller committed"
        await _end(dialect, conn, "commit")
        for task in (child, *graph):
            assert is_waiting(await _get(store, task))
        assert [t.id for t in await store.dependencies(graph[1].id)] == [graph[0].id, parent.id]

        gone = await store.submit(name="e", after=[parent], tx=conn)
        await _end(dialect, conn, "rollback")
        assert await store.get(gone.id) is None
        assert await store.dependencies(gone.id) == []
        assert scalar(dialect, db_target, "select count(*) from cairnqd_task_deps") == 4
        assert scalar(dialect, db_target, "select count(*) from cairnqd_task_waits") == 3
    finally:
        await _end(dialect, conn, "close")


async def test_a_submit_waits_for_a_parent_being_settled(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    """Postgres: a settle under way when the dependent is submitted either commits
    first (and the submit sees the parent succeeded) or sees the dependent's edges;
    the dependent is never left waiting for a parent that has already succeeded."""
    if dialect == "sqlite":
        pytest.skip("one writer at a time: a SQLite submit cannot overlap a settle")
    parent = await store.submit(name="a")
    [claimed] = await store.claim(queues=["default"], worker_id="w1", limit=1)
    settler = await psycopg.AsyncConnection.connect(db_target)
    try:
        await settler.execute(
            "update cairnq_tasks set status = 'succeeded', lease_until_ms = null, "
            "completed_at_ms = updated_at_ms where id = %s",
            (claimed.id,),
        )
        submitting = asyncio.create_task(store.submit(name="b", after=[parent]))

        other = await psycopg.AsyncConnection.connect(db_target, autocommit=True)
        try:

            async def waiting_on_lock() -> bool:
                row = await (
                    await other.execute(
                        "select count(*) from pg_stat_activity "
                        "where wait_event_type = 'Lock' and datname = current_database()"
                    )
                ).fetchone()
                return row is not None and row[0] >= 1

            await wait_for_async("the submit to wait on the parent's row", waiting_on_lock)
        finally:
            await other.close()
        assert not submitting.done()
        await settler.commit()
        child = await submitting
    finally:
        await settler.close()
    assert not is_waiting(child) and child.status == "queued"
    assert [t.id for t in await store.claim(queues=["default"], worker_id="w1", limit=5)] == [
        child.id
    ]


async def test_postgres_wakes_the_dependents_queue_when_it_is_released(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    """The protocol's notify trigger fires on status changes only; a released task's
    status does not change, so ours sends `cairnq_queued` with its queue."""
    if dialect == "sqlite":
        pytest.skip("SQLite has no notifications: waiters watch the file")
    parent = await store.submit(name="a", queue="first")
    child = await store.submit(name="b", queue="second", after=[parent])
    listener = await psycopg.AsyncConnection.connect(db_target, autocommit=True)
    try:
        await listener.execute("listen cairnq_queued")
        [claimed] = await store.claim(queues=["first"], worker_id="w1", limit=1)
        await store.complete(task_id=claimed.id, worker_id="w1", result=None)
        heard: list[str] = []
        async for note in listener.notifies(timeout=10, stop_after=1):
            heard.append(note.payload)
    finally:
        await listener.close()
    assert heard == ["second"]
    assert not is_waiting(await _get(store, child))


async def test_keys_work_as_usual_on_a_waiting_task(store: TaskStore) -> None:
    a = await store.submit(name="a")
    held = await store.submit(name="b", key="nightly", after=[a])
    assert is_waiting(held)
    found = await store.get_by_key("nightly")
    assert found is not None and found.id == held.id and is_waiting(found)
    # reuse hands back the waiting task as it is (queued): its dependencies stand.
    again = await store.submit(name="b", key="nightly")
    assert again.id == held.id and is_waiting(again)
    # replace cancels it (a live task) and the new one waits on what it names.
    fresh = await store.submit(name="b", key="nightly", conflict="replace", after=[a])
    assert fresh.id != held.id and is_waiting(fresh)
    assert (await _get(store, held)).status == "canceled"
    canceled = await store.cancel_by_key("nightly")
    assert canceled is not None and canceled.status == "canceled"
    retried = await store.retry_by_key("nightly")
    assert retried is not None and is_waiting(retried), "as the triggers left it"
    await _succeed(store, a)
    assert [t.id for t in await store.claim(queues=["default"], worker_id="w1", limit=5)] == [
        fresh.id
    ]


async def test_parents_settled_at_once_release_their_dependents_once(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    """Several connections settle the parents of two shared fan-ins at the same time:
    each fan-in is released exactly when its last parent succeeded, never lost."""
    parents = [await store.submit(name="p", payload={"i": i}) for i in range(12)]
    await store.submit(name="left", after=parents)
    right = await store.submit(name="right", after=list(reversed(parents)))
    claimed = await store.claim(queues=["default"], worker_id="w1", limit=20, names=["p"])
    assert len(claimed) == 12
    others = [make_store(dialect, db_target) for _ in range(3)]
    for other in others:
        await other.connect()
    try:

        async def settle(other: TaskStore, share: list[Task]) -> None:
            for task in share:
                await other.complete(task_id=task.id, worker_id="w1", result=task.payload)

        await asyncio.gather(*(settle(o, claimed[i::3]) for i, o in enumerate(others)))
    finally:
        for other in others:
            await other.close()
    got = await store.claim(queues=["default"], worker_id="w1", limit=5)
    assert sorted(t.name for t in got) == ["left", "right"]
    assert await store.waiting_counts() == {}
    assert [t.result for t in await store.dependencies(right.id)] == [
        {"i": i} for i in reversed(range(12))
    ]


def test_sqlite_plans_reach_the_dependency_indexes(store: TaskStore, db_target: str) -> None:
    """The lookups every settle, failure and purge makes go through an index, not a
    scan of the edge tables (the triggers' statements are explained as written)."""
    if store.dialect != "sqlite":
        pytest.skip("SQLite's EXPLAIN QUERY PLAN")
    conn = sqlite3.connect(db_target)
    try:

        def plan(sql: str) -> str:
            rows = conn.execute(f"explain query plan {sql}", {"id": "task_x"}).fetchall()
            return " | ".join(str(r[-1]) for r in rows)

        by_parent = plan("select task_id from cairnqd_task_deps where parent_id = :id")
        assert "cairnqd_task_deps_parent_idx" in by_parent
        below = plan("select task_id from cairnqd_task_ancestors where ancestor_id = :id")
        assert "cairnqd_task_ancestors_ancestor_idx" in below
        held = plan("select task_id from cairnqd_task_waits where failed_by = :id")
        assert "cairnqd_task_waits_failed_by_idx" in held
        purge = (Path(__file__).parents[2] / "protocol/sql/sqlite/purge.sql").read_text()
        purge_plan = plan(
            purge.replace(":before_ms", "0").replace(":limit", "10")
            .replace(":queue", "null").replace(":status", "null").replace(":name", "null")
        )  # fmt: skip
        assert "cairnqd_task_deps_parent_idx" in purge_plan
        assert "SCAN cairnqd_task_deps" not in purge_plan
    finally:
        conn.close()
