"""`submit_many`: one transaction, in order, keys honoured item by item, all or nothing."""

from __future__ import annotations

import time

import pytest

from cairnqd.errors import AlreadyExists, SerializationError
from cairnqd.models import TaskDef
from cairnqd.store.base import TaskStore
from tests.support.store import count_rows, query, scalar


# 25 go in as one statement; 300 as several SQLite row statements (256 + 32 + 8 + 4
# rows), and on Postgres as one json_to_recordset statement.
@pytest.mark.parametrize("n", [25, 300])
async def test_order_and_fields_are_preserved(
    store: TaskStore, dialect: str, db_target: str, n: int
) -> None:
    items = [
        {
            "name": f"job.{i % 3}",
            "payload": {"i": i, "text": "h\u00e9llo\ttab\\back\nline", "nested": [i, {"k": None}]},
            "queue": ("default", "gpu")[i % 2],
            "priority": i % 4,
            "max_attempts": 1 + i % 5,
            "metadata": {"batch": "b1", "i": i},
            "correlation_id": f"corr-{i % 2}" if i % 3 else None,
            "delay_ms": (0, 60_000)[i % 2],
        }
        for i in range(n)
    ]
    before_ms = int(time.time() * 1000)
    tasks = await store.submit_many(items)
    assert len(tasks) == n
    assert len({t.id for t in tasks}) == n
    for item, task in zip(items, tasks, strict=True):
        assert task.status == "queued"
        assert task.root_id == task.id
        assert task.attempt == 0
        assert task.run_at_ms == task.created_at_ms + item["delay_ms"]
        assert task.created_at_ms == task.updated_at_ms >= before_ms - 1_000
        for field in ("name", "payload", "queue", "priority", "max_attempts", "metadata"):
            assert getattr(task, field) == item[field], field
        assert task.correlation_id == item["correlation_id"]
        stored = await store.get(task.id)
        assert stored == task
    assert count_rows(dialect, db_target) == (n, 0)


# 40 go in as one insert_many; 1,200 on Postgres as one COPY stream sent 50 rows at a
# time, every row stamped with one clock reading.
@pytest.mark.parametrize("n", [40, 1200])
async def test_text_that_needs_escaping_and_every_optional_id_round_trips(
    store: TaskStore, n: int
) -> None:
    # Postgres writes insert_many's JSON and COPY's rows by hand: quotes, backslashes,
    # tabs, newlines, control and non-BMP characters in every text column, payloads of
    # every JSON type, ids present, absent, or (root) the task's own, and delays.
    odd = 'q"uo\\te\n\t\r\u00e9\U0001f600\x01\\N'
    payloads = ["text", 7, 2.5, [1, "two", None], {"k": odd}, True, {}]
    items = [
        {
            "name": f"job.{odd}.{i % 2}",
            "queue": f"queue {odd}",
            "payload": payloads[i % len(payloads)],
            "metadata": {odd: odd} if i % 2 else None,
            "parent_id": f"parent {odd} {i}" if i % 3 == 0 else None,
            "root_id": f"root {odd} {i}" if i % 4 == 0 else None,
            "correlation_id": f"corr {odd}" if i % 5 == 0 else None,
            "priority": -(2**31) if i % 2 else 2**31 - 1,
            "delay_ms": (0, 1, 86_400_000)[i % 3],
        }
        for i in range(n)
    ]
    tasks = await store.submit_many(items)
    assert len({t.created_at_ms for t in tasks}) == 1  # one clock reading for the list
    for item, task in zip(items, tasks, strict=True):
        stored = await store.get(task.id)
        assert stored == task
        assert (task.name, task.queue, task.payload) == (
            item["name"],
            item["queue"],
            item["payload"],
        )
        assert task.metadata == (item["metadata"] or {})
        assert task.parent_id == item["parent_id"]
        assert task.root_id == (item["root_id"] or task.id)
        assert task.correlation_id == item["correlation_id"]
        assert task.priority == item["priority"]
        assert task.run_at_ms == task.created_at_ms + item["delay_ms"]


@pytest.mark.parametrize("n", [30, 1200])
async def test_a_lists_ids_ascend_so_equal_tasks_are_claimed_in_list_order(
    store: TaskStore, n: int
) -> None:
    tasks = await store.submit_many([{"name": "job", "payload": {"i": i}} for i in range(n)])
    ids = [t.id for t in tasks]
    assert ids == sorted(ids)
    # A claim takes the first of equal tasks by id: the list's head, in order.
    first = await store.claim(queues=["default"], worker_id="w1", limit=1)
    assert [t.payload["i"] for t in first] == [0]
    half = await store.claim(queues=["default"], worker_id="w1", limit=n // 2)
    assert sorted(t.payload["i"] for t in half) == list(range(1, n // 2 + 1))


async def test_accepts_task_defs_and_defaults(store: TaskStore) -> None:
    before_ms = int(time.time() * 1000)
    tasks = await store.submit_many(
        [{"name": TaskDef("typed.job")}, {"name": "plain.job", "delay_ms": 60_000}]
    )
    assert [t.name for t in tasks] == ["typed.job", "plain.job"]
    first, delayed = tasks
    assert (first.queue, first.priority, first.max_attempts, first.payload) == (
        "default",
        0,
        3,
        {},
    )
    assert first.metadata == {}
    assert delayed.run_at_ms >= before_ms + 60_000
    claimed = await store.claim(queues=["default"], worker_id="w", limit=10)
    assert [t.id for t in claimed] == [first.id], "a delayed task is not due yet"


async def test_empty_batch_is_a_no_op(store: TaskStore, dialect: str, db_target: str) -> None:
    assert await store.submit_many([]) == []
    assert count_rows(dialect, db_target) == (0, 0)


async def test_same_key_twice_with_reuse_returns_one_task(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    tasks = await store.submit_many(
        [
            {"name": "a", "key": "k1", "payload": {"n": 1}},
            {"name": "a", "key": "k1", "payload": {"n": 2}},
            {"name": "a", "key": "k1", "conflict": "reuse-succeeded", "payload": {"n": 3}},
        ]
    )
    assert len({t.id for t in tasks}) == 1
    assert tasks[0].payload == {"n": 1}, "reuse hands back the first task, not a new one"
    assert count_rows(dialect, db_target) == (1, 1)


async def test_replace_within_a_batch_cancels_the_earlier_item(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    first, second = await store.submit_many(
        [{"name": "a", "key": "k"}, {"name": "a", "key": "k", "conflict": "replace"}]
    )
    assert first.id != second.id
    old = await store.get(first.id)
    assert old is not None and old.status == "canceled"
    assert old.completed_at_ms is not None
    current = await store.get_by_key("k")
    assert current is not None and current.id == second.id and current.status == "queued"
    assert count_rows(dialect, db_target) == (2, 1)


async def test_keys_from_earlier_submits_are_honoured(store: TaskStore) -> None:
    existing = await store.submit(name="a", key="known")
    tasks = await store.submit_many(
        [{"name": "a", "key": "known"}, {"name": "b", "key": "unknown"}]
    )
    assert tasks[0].id == existing.id
    assert tasks[1].id != existing.id


async def test_mix_of_keyed_and_keyless(store: TaskStore, dialect: str, db_target: str) -> None:
    items = []
    for i in range(30):
        item: dict[str, object] = {"name": "mixed", "payload": {"i": i}}
        if i % 3 == 0:
            item["key"] = f"key-{i % 9}"  # keys 0, 3, 6 each appear several times
        items.append(item)
    tasks = await store.submit_many(items)
    assert [t.payload for t in tasks][1] == {"i": 1}
    by_key: dict[str, set[str]] = {}
    for item, task in zip(items, tasks, strict=True):
        if "key" in item:
            by_key.setdefault(str(item["key"]), set()).add(task.id)
    assert {k: len(v) for k, v in by_key.items()} == {"key-0": 1, "key-3": 1, "key-6": 1}
    keyless = [t for item, t in zip(items, tasks, strict=True) if "key" not in item]
    assert len({t.id for t in keyless}) == 20
    assert count_rows(dialect, db_target) == (23, 3)
    for key, ids in by_key.items():
        got = await store.get_by_key(key)
        assert got is not None and {got.id} == ids


async def test_already_exists_midway_rolls_back_everything(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    taken = await store.submit(name="a", key="taken")
    before = count_rows(dialect, db_target)
    keys_before = query(dialect, db_target, "select key, task_id from cairnq_task_keys")
    batch = [
        {"name": "ok.1"},
        {"name": "ok.2", "key": "fresh"},
        {"name": "ok.3", "key": "taken", "conflict": "replace"},
        {"name": "clash", "key": "taken", "conflict": "reject"},
        {"name": "ok.4"},
    ]
    with pytest.raises(AlreadyExists) as info:
        await store.submit_many(batch)
    assert info.value.key == "taken"
    assert count_rows(dialect, db_target) == before
    assert query(dialect, db_target, "select key, task_id from cairnq_task_keys") == keys_before
    still = await store.get(taken.id)
    assert still is not None and still.status == "queued", "the replace was not rolled back"
    assert await store.get_by_key("fresh") is None
    # The store is usable afterwards (the transaction and its lock were released).
    again = await store.submit_many([{"name": "after"}])
    assert again[0].status == "queued"


async def test_large_batch(store: TaskStore, dialect: str, db_target: str) -> None:
    items = [{"name": "bulk", "payload": {"i": i}, "priority": i % 7} for i in range(5000)]
    tasks = await store.submit_many(items)
    assert [t.payload["i"] for t in tasks] == list(range(5000))
    assert len({t.id for t in tasks}) == 5000
    assert count_rows(dialect, db_target) == (5000, 0)
    assert scalar(dialect, db_target, "select count(distinct id) from cairnq_tasks") == 5000
    depth = await store.queue_depth("default", 6000)
    assert depth == 1000


# -- long lists: on Postgres the next chunk is checked while the server inserts one ----


def _long_list(n: int) -> list[dict[str, object]]:
    return [{"name": "long", "payload": {"i": i}} for i in range(n)]


async def test_a_bad_item_late_in_a_long_list_writes_nothing(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    """The first chunks are already inserted when item 900 turns out bad: the whole
    transaction rolls back, and the error names the item."""
    items = _long_list(1000)
    items[900] = {"name": "long", "priority": 2**40}
    with pytest.raises(ValueError, match=r"tasks\[900\]: priority must be <="):
        await store.submit_many(items)
    items[900] = {"name": "long", "payload": {"bad": float("nan")}}
    with pytest.raises(SerializationError, match=r"tasks\[900\]: payload"):
        await store.submit_many(items)
    items[900] = "not a mapping"  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"tasks\[900\] must be a mapping"):
        await store.submit_many(items)
    assert count_rows(dialect, db_target) == (0, 0)
    # The store still works, and the same list without the bad item lands whole.
    items[900] = {"name": "long", "payload": {"i": 900}}
    tasks = await store.submit_many(items)
    assert [t.payload for t in tasks] == [{"i": i} for i in range(1000)]
    assert count_rows(dialect, db_target) == (1000, 0)


async def test_a_key_clash_late_in_a_long_list_writes_nothing(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    await store.submit(name="a", key="taken")
    before = count_rows(dialect, db_target)
    items = _long_list(800)
    items[760] = {"name": "clash", "key": "taken", "conflict": "reject"}
    with pytest.raises(AlreadyExists):
        await store.submit_many(items)
    assert count_rows(dialect, db_target) == before


async def test_keys_across_chunk_boundaries_behave_as_consecutive_submits(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    items = _long_list(1200)
    # On and beside the cuts between Postgres's steps of 50 (each keyed item also ends
    # a COPY run and starts another after it).
    cuts = (99, 100, 101, 299, 300, 699, 700, 999)
    for at in cuts:
        items[at] = {"name": "keyed", "key": "one", "payload": {"i": at}}
    tasks = await store.submit_many(items)
    keyed = {tasks[at].id for at in cuts}
    assert len(keyed) == 1  # the first took the key; the rest reused it
    reused = cuts[1:]
    assert [t.payload for i, t in enumerate(tasks) if i not in reused] == [
        {"i": i} for i in range(1200) if i not in reused
    ]
    assert count_rows(dialect, db_target) == (1200 - len(reused), 1)
