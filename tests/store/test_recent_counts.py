"""`TaskStore.recent_counts`, which `cairnqd top` divides into rates, on both dialects:
tasks submitted and ended in a window, read from index ranges of that window, so tasks
from before it never count and a purge of old rows changes nothing."""

from __future__ import annotations

import time

from cairnqd._ids import new_task_id, task_id_floor
from cairnqd.client import CairnQ
from cairnqd.store.base import TaskStore
from tests.support.store import query


def test_the_id_floor_sorts_below_every_id_of_its_millisecond_and_above_earlier() -> None:
    now = int(time.time() * 1000)
    made = new_task_id()
    assert task_id_floor(now - 1000) <= made
    assert task_id_floor(now + 1000) > made


async def test_submits_and_ends_in_the_window_count(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    client = CairnQ(store)
    old = await client.submit("n", queue="a")
    await store.cancel(old.id)
    # The old task is from "an hour ago": its id and end are moved back by hand.
    hour_ago = int(time.time() * 1000) - 3_600_000
    query(
        dialect,
        db_target,
        "update cairnq_tasks set id = ?, completed_at_ms = ? where id = ?",
        [task_id_floor(hour_ago)[:-1] + "1", hour_ago, old.id],
    )
    since = store.now_ms()
    fresh = [await client.submit("n", queue="a") for _ in range(5)]
    other = await client.submit("n", queue="b")
    for t in fresh[:2]:
        await store.cancel(t.id)
    counts = await store.recent_counts(since - 50)
    assert counts == {"a": {"submitted": 5, "canceled": 2}, "b": {"submitted": 1}}
    await store.purge(older_than_ms=60_000)  # the hour-old task goes; nothing recent does
    assert await store.recent_counts(since - 50) == counts
    assert other.id >= task_id_floor(since - 50)
