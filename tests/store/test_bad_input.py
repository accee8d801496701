"""Bad arguments fail loudly, name the argument, and write nothing (SPEC §4.4, §6).

Every case counts the task and key rows before and after, on both dialects.
"""

from __future__ import annotations

import datetime
import decimal
import math
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from cairnqd.errors import AlreadyExists, SerializationError
from cairnqd.store.base import TaskStore
from tests.store.helpers import count_rows

Call = Callable[[TaskStore], Awaitable[Any]]


async def _seed(store: TaskStore) -> None:
    """Something to purge and a key to collide with, so "nothing written" means
    nothing deleted, repointed or canceled as well."""
    done = await store.submit(name="seed.done", key="seed-key")
    claimed = await store.claim(queues=["default"], worker_id="w", names=["seed.done"])
    assert [t.id for t in claimed] == [done.id]
    await store.complete(task_id=done.id, worker_id="w", result={"ok": True})
    await store.submit(name="seed.live", key="live-key")


def _submit(**kwargs: Any) -> Call:
    async def call(store: TaskStore) -> Any:
        return await store.submit(**{"name": "bad.input", **kwargs})

    return call


CASES: list[tuple[str, Call, type[Exception], str]] = [
    ("unknown-conflict", _submit(conflict="upsert"), ValueError, "conflict"),
    (
        "unknown-conflict-keyed",
        _submit(key="live-key", conflict="overwrite"),
        ValueError,
        "conflict",
    ),
    ("max-attempts-0", _submit(max_attempts=0), ValueError, "max_attempts"),
    ("max-attempts-negative", _submit(max_attempts=-3), ValueError, "max_attempts"),
    ("delay-negative", _submit(delay_ms=-1), ValueError, "delay_ms"),
    ("delay-keyed-negative", _submit(key="fresh-key", delay_ms=-1), ValueError, "delay_ms"),
    ("payload-nan", _submit(payload={"x": math.nan}), SerializationError, "payload"),
    ("payload-infinity", _submit(payload={"x": math.inf}), SerializationError, "payload"),
    ("payload-neg-infinity", _submit(payload=[-math.inf]), SerializationError, "payload"),
    ("payload-set", _submit(payload={"tags": {"a", "b"}}), SerializationError, "payload"),
    ("payload-bytes", _submit(payload={"blob": b"\x00\x01"}), SerializationError, "payload"),
    (
        "payload-datetime",
        _submit(payload={"at": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)}),
        SerializationError,
        "payload",
    ),
    (
        "payload-decimal",
        _submit(payload={"amount": decimal.Decimal("1.10")}),
        SerializationError,
        "payload",
    ),
    ("payload-uuid", _submit(payload={"id": uuid.uuid4()}), SerializationError, "payload"),
    (
        "payload-nan-keyed",
        _submit(key="fresh-key", payload={"x": math.nan}),
        SerializationError,
        "payload",
    ),
    ("metadata-nan", _submit(metadata={"x": math.nan}), SerializationError, "metadata"),
    (
        "list-unknown-status",
        lambda s: s.list(status="done"),
        ValueError,
        "status",
    ),
    ("list-negative-limit", lambda s: s.list(limit=-1), ValueError, "limit"),
    ("list-negative-offset", lambda s: s.list(offset=-1), ValueError, "offset"),
    (
        "purge-unknown-status",
        lambda s: s.purge(status="finished"),
        ValueError,
        "status",
    ),
    ("purge-status-queued", lambda s: s.purge(status="queued"), ValueError, "status"),
    ("purge-status-running", lambda s: s.purge(status="running"), ValueError, "status"),
    ("purge-limit-0", lambda s: s.purge(limit=0), ValueError, "limit"),
    (
        "purge-negative-age",
        lambda s: s.purge(older_than_ms=-1),
        ValueError,
        "older_than_ms",
    ),
    (
        "queue-depth-negative",
        lambda s: s.queue_depth("default", -1),
        ValueError,
        "max_depth",
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "argument"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
async def test_bad_argument_is_refused_and_writes_nothing(
    store: TaskStore,
    dialect: str,
    db_target: str,
    call: Call,
    error: type[Exception],
    argument: str,
) -> None:
    await _seed(store)
    before = count_rows(dialect, db_target)
    statuses_before = await store.stats()
    with pytest.raises(error) as info:
        await call(store)
    assert type(info.value) is error
    assert argument in str(info.value), f"{str(info.value)!r} does not name {argument!r}"
    assert count_rows(dialect, db_target) == before
    assert await store.stats() == statuses_before
    live = await store.get_by_key("live-key")
    assert live is not None and live.status == "queued"


async def test_reject_on_a_taken_key_writes_nothing(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    await _seed(store)
    before = count_rows(dialect, db_target)
    with pytest.raises(AlreadyExists) as info:
        await store.submit(name="again", key="seed-key", conflict="reject")
    assert info.value.key == "seed-key"
    assert "seed-key" in str(info.value)
    assert count_rows(dialect, db_target) == before


# -- submit_many -------------------------------------------------------------------------

GOOD = {"name": "batch.good", "payload": {"ok": True}}
BAD_ITEMS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("conflict", {"name": "batch.bad", "conflict": "merge"}, ValueError, "conflict"),
    ("max-attempts", {"name": "batch.bad", "max_attempts": 0}, ValueError, "max_attempts"),
    ("delay", {"name": "batch.bad", "delay_ms": -5}, ValueError, "delay_ms"),
    ("unknown-argument", {"name": "batch.bad", "colour": "red"}, ValueError, "colour"),
    ("missing-name", {"payload": {}}, ValueError, "name"),
    (
        "payload-nan",
        {"name": "batch.bad", "payload": {"x": math.nan}},
        SerializationError,
        "payload",
    ),
    (
        "payload-set",
        {"name": "batch.bad", "payload": {"s": {1, 2}}},
        SerializationError,
        "payload",
    ),
]


@pytest.mark.parametrize(
    ("bad", "error", "argument"),
    [case[1:] for case in BAD_ITEMS],
    ids=[case[0] for case in BAD_ITEMS],
)
async def test_submit_many_with_one_bad_item_writes_nothing(
    store: TaskStore,
    dialect: str,
    db_target: str,
    bad: dict[str, Any],
    error: type[Exception],
    argument: str,
) -> None:
    await _seed(store)
    before = count_rows(dialect, db_target)
    batch = [GOOD, {**GOOD, "key": "batch-key"}, bad, GOOD]
    with pytest.raises(error) as info:
        await store.submit_many(batch)
    message = str(info.value)
    assert "tasks[2]" in message, f"{message!r} does not name the bad item's index"
    assert argument in message, f"{message!r} does not name {argument!r}"
    assert count_rows(dialect, db_target) == before
    assert await store.get_by_key("batch-key") is None


async def test_submit_many_rejects_a_non_mapping_item(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    before = count_rows(dialect, db_target)
    with pytest.raises(ValueError, match=r"tasks\[1\]"):
        await store.submit_many([GOOD, ["batch.bad"], GOOD])  # type: ignore[list-item]
    assert count_rows(dialect, db_target) == before
