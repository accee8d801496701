"""cairnqd and the public `cairnq` 0.15.1 SDK on one database (docs/protocol.md §3.5, §3.6, §9.4).

Both directions on both dialects: work submitted by one side is claimed, settled and
waited on by the other, keys resolve the same way on both sides, and keyed writes from
the two SDKs exclude each other.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import cairnq
import pytest

import cairnqd
from tests.support.store import count_rows, query
from tests.support.waiting import wait_for_async

WAIT = {"timeout_ms": 15_000, "poll_ms": 20, "max_poll_ms": 100}


async def test_their_task_runs_on_our_store(theirs: Any, ours: cairnqd.CairnQ) -> None:
    task = await theirs.submit("image.generate", {"prompt": "cairn", "size": 64})
    waiting = asyncio.create_task(theirs.wait(task.id, **WAIT))

    claimed = await ours.store.claim(
        queues=["default"], worker_id="cairnqd-worker", names=["image.generate"]
    )
    assert [t.id for t in claimed] == [task.id]
    mine = claimed[0]
    assert mine.payload == {"prompt": "cairn", "size": 64}
    assert (mine.status, mine.attempt, mine.worker_id) == ("running", 1, "cairnqd-worker")
    await ours.store.progress(
        task_id=task.id, worker_id="cairnqd-worker", progress=0.5, message="half"
    )
    result = {"url": "s3://img/cairn", "size": 64, "engine": "cairnqd"}
    await ours.store.complete(task_id=task.id, worker_id="cairnqd-worker", result=result)

    done = await waiting
    assert done.status == "succeeded"
    assert done.result == result
    assert done.progress == 1.0
    assert done.message == "half"
    assert done.lease_until_ms is None


async def test_their_call_is_served_by_our_claim_loop(theirs: Any, ours: cairnqd.CairnQ) -> None:
    async def serve_one() -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            got = await ours.store.claim(queues=["io"], worker_id="cairnqd-loop", lease_ms=10_000)
            if got:
                t = got[0]
                await ours.store.complete(
                    task_id=t.id,
                    worker_id="cairnqd-loop",
                    result={"engine": "cairnqd", "sent": True, "to": t.payload["to"]},
                )
                return
            await ours.store.claim_wake(["io"], 20)
        raise AssertionError("nothing to claim within 15s")

    server = asyncio.create_task(serve_one())
    result = await theirs.call("notification.send", {"to": 42}, queue="io", **WAIT)
    await server
    assert result == {"engine": "cairnqd", "sent": True, "to": 42}


async def test_our_task_runs_on_their_store(theirs: Any, ours: cairnqd.CairnQ) -> None:
    task = await ours.submit("notification.send", {"to": 42}, queue="io", priority=3)
    assert task.id.startswith("task_") and len(task.id) == len("task_") + 26
    waiting = asyncio.create_task(ours.wait(task.id, **WAIT))

    claimed = await theirs.store.claim(
        queues=["io"], worker_id="upstream-worker", names=["notification.send"]
    )
    assert [t.id for t in claimed] == [task.id]
    theirs_view = claimed[0]
    assert theirs_view.payload == {"to": 42}
    assert theirs_view.root_id == task.id
    assert theirs_view.priority == 3
    await theirs.store.heartbeat(task_id=task.id, worker_id="upstream-worker", lease_ms=20_000)
    await theirs.store.complete(
        task_id=task.id,
        worker_id="upstream-worker",
        result={"engine": "python", "sent": True, "to": 42},
    )

    done = await waiting
    assert done.status == "succeeded"
    assert done.result == {"engine": "python", "sent": True, "to": 42}
    assert done.worker_id == "upstream-worker"


async def test_their_failure_reaches_our_call(theirs: Any, ours: cairnqd.CairnQ) -> None:
    async def fail_it() -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            got = await theirs.store.claim(queues=["default"], worker_id="upstream-worker")
            if got:
                await theirs.store.fail(
                    task_id=got[0].id,
                    worker_id="upstream-worker",
                    error=cairnq.TaskError("no such user", code="bad_user").envelope(),
                    retryable=False,
                )
                return
            await asyncio.sleep(0.01)
        raise AssertionError("nothing to claim within 15s")

    failer = asyncio.create_task(fail_it())
    with pytest.raises(cairnqd.TaskFailed) as info:
        await ours.call("user.lookup", {"id": 7}, max_attempts=1, **WAIT)
    await failer
    assert (info.value.code, info.value.message, info.value.retryable) == (
        "bad_user",
        "no such user",
        False,
    )


async def test_their_expired_lease_is_recovered_by_our_claim(
    theirs: Any, ours: cairnqd.CairnQ
) -> None:
    task = await theirs.submit("crashy", {"n": 1})
    first = await theirs.store.claim(queues=["default"], worker_id="dead-worker", lease_ms=100)
    assert [t.id for t in first] == [task.id]

    again = await wait_for_async(
        "our claim to recover the expired lease",
        lambda: ours.store.claim(queues=["default"], worker_id="rescuer"),
        15,
    )
    assert [t.id for t in again] == [task.id]
    assert (again[0].attempt, again[0].worker_id) == (2, "rescuer")
    with pytest.raises(cairnq.LostLease):
        await theirs.store.complete(task_id=task.id, worker_id="dead-worker", result=None)


# -- keys --------------------------------------------------------------------------------


async def test_key_reuse_across_sdks(
    theirs: Any, ours: cairnqd.CairnQ, dialect: str, db_target: str
) -> None:
    from_them = await theirs.submit("keyed", {"v": 1}, key="order-17")
    reused = await ours.submit("keyed", {"v": 2}, key="order-17")
    assert reused.id == from_them.id
    assert reused.payload == {"v": 1}

    from_us = await ours.submit("keyed", {"v": 3}, key="order-18")
    reused_by_them = await theirs.submit("keyed", {"v": 4}, key="order-18")
    assert reused_by_them.id == from_us.id

    with pytest.raises(cairnq.AlreadyExists):
        await theirs.submit("keyed", key="order-18", conflict="reject")
    with pytest.raises(cairnqd.AlreadyExists):
        await ours.submit("keyed", key="order-17", conflict="reject")

    # A replace on one side cancels the task the other side created and repoints the key.
    replaced = await ours.submit("keyed", {"v": 5}, key="order-17", conflict="replace")
    old = await theirs.get(from_them.id)
    assert old.status == "canceled"
    assert (await theirs.get_by_key("order-17")).id == replaced.id
    assert (await theirs.get_status_by_key("order-17")).status == "queued"
    assert count_rows(dialect, db_target) == (3, 2)


async def test_concurrent_same_key_submits_from_both_sdks_collapse(
    theirs: Any, ours: cairnqd.CairnQ, dialect: str, db_target: str
) -> None:
    submits = []
    for i in range(12):
        side = theirs if i % 2 else ours
        submits.append(side.submit("dedupe", {"i": i}, key="shared"))
    tasks = await asyncio.gather(*submits)
    assert len({t.id for t in tasks}) == 1
    assert query(dialect, db_target, "select key, task_id from cairnq_task_keys") == [
        ("shared", tasks[0].id)
    ]
    assert count_rows(dialect, db_target) == (1, 1)


async def test_purge_by_us_frees_their_key(theirs: Any, ours: cairnqd.CairnQ) -> None:
    task = await theirs.submit("once", key="purge-me")
    got = await theirs.store.claim(queues=["default"], worker_id="w")
    await theirs.store.complete(task_id=got[0].id, worker_id="w", result=None)

    async def purged() -> list[str]:
        # purge's cutoff is strict: a task finished this millisecond is not yet older.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            ids = await ours.purge(status="succeeded")
            if ids:
                return ids
            await asyncio.sleep(0.005)
        return []

    assert await purged() == [task.id]
    assert await theirs.get_by_key("purge-me") is None
    fresh = await theirs.submit("once", key="purge-me")
    assert fresh.id != task.id and fresh.status == "queued"


async def test_stats_and_lists_agree(theirs: Any, ours: cairnqd.CairnQ) -> None:
    for i in range(3):
        await theirs.submit("s", {"i": i}, queue="alpha")
        await ours.submit("s", {"i": i}, queue="beta")
    await ours.store.claim(queues=["alpha"], worker_id="w", limit=1)
    assert await ours.stats() == await theirs.stats()
    assert await ours.stats("alpha") == await theirs.stats("alpha")
    ours_list = [t.id for t in await ours.list(queue="beta")]
    theirs_list = [t.id for t in await theirs.list(queue="beta")]
    assert ours_list == theirs_list and len(ours_list) == 3
    assert await ours.queue_depth("alpha", 10) == await theirs.queue_depth("alpha", 10) == 8


async def test_their_worker_runs_a_task_our_hand_back_gave_its_attempt_back(
    theirs: Any, ours: cairnqd.CairnQ
) -> None:
    # A roll cut their task short under our daemon: the row goes back to queued with
    # attempt lowered again, which their client reads and their claim raises as usual.
    task = await theirs.submit("report.build", {"month": 11}, max_attempts=1)
    (mine,) = await ours.store.claim(queues=["default"], worker_id="cairnqd-child")
    await ours.store.progress(
        task_id=task.id, worker_id="cairnqd-child", progress=0.4, message="building"
    )
    rows = await ours.store.release_worker(
        "cairnqd-child",
        message="its worker process exited",
        interrupted=[(mine.id, mine.attempt)],
        interruption_cap=3,
    )
    assert [(r["id"], r["status"], r.get("interrupted")) for r in rows] == [
        (task.id, "queued", True)
    ]
    seen = await theirs.get(task.id)
    assert (seen.status, seen.attempt, seen.worker_id) == ("queued", 0, None)
    assert (seen.progress, seen.message, seen.lease_until_ms) == (None, None, None)

    (again,) = await theirs.store.claim(queues=["default"], worker_id="upstream-worker")
    assert (again.id, again.attempt) == (task.id, 1)
    await theirs.store.complete(task_id=task.id, worker_id="upstream-worker", result={"ok": 1})
    done = await ours.get(task.id)
    assert done is not None and (done.status, done.attempt) == ("succeeded", 1)
