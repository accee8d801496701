"""Bad arguments fail loudly, name the argument, and write nothing (docs/protocol.md
§4.4, §4.6, §6).

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
from tests.support.store import count_rows

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


# -- portable values: what Postgres can store, refused the same way on both dialects ------

INT4_MAX = 2**31 - 1


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


PORTABLE_CASES: list[tuple[str, Call, type[Exception], str]] = [
    ("priority-int4-overflow", _submit(priority=2**31), ValueError, "priority"),
    ("priority-int4-underflow", _submit(priority=-(2**31) - 1), ValueError, "priority"),
    ("priority-int64-overflow", _submit(priority=2**63), ValueError, "priority"),
    ("max-attempts-int4", _submit(max_attempts=2**40), ValueError, "max_attempts"),
    ("delay-too-long", _submit(delay_ms=2**63), ValueError, "delay_ms"),
    ("queue-10k-chars", _submit(queue="q" * 10_000), ValueError, "queue"),
    ("name-10k-chars", _submit(name="n" * 10_000), ValueError, "name"),
    ("key-1mb", _submit(key="k" * 1_000_000), ValueError, "key"),
    ("key-1001-bytes", _submit(key="k" * 1001), ValueError, "key"),
    ("key-1002-utf8-bytes", _submit(key="é" * 501), ValueError, "key"),
    ("correlation-too-long", _submit(correlation_id="c" * 1001), ValueError, "correlation_id"),
    ("name-nul", _submit(name="bad\x00name"), ValueError, "name"),
    ("queue-nul", _submit(queue="q\x00"), ValueError, "queue"),
    ("key-nul", _submit(key="k\x00"), ValueError, "key"),
    ("parent-nul", _submit(parent_id="p\x00"), ValueError, "parent_id"),
    ("name-lone-surrogate", _submit(name="bad\ud800"), ValueError, "name"),
    ("key-lone-surrogate", _submit(key="\udfff"), ValueError, "key"),
    ("root-lone-surrogate", _submit(root_id="r\udc80"), ValueError, "root_id"),
    ("payload-lone-surrogate", _submit(payload={"s": "x\ud800y"}), SerializationError, "payload"),
    ("payload-low-surrogate", _submit(payload=["\udc00"]), SerializationError, "payload"),
    ("payload-reversed-pair", _submit(payload=["\ude00\ud83d"]), SerializationError, "payload"),
    ("payload-key-surrogate", _submit(payload={"\ud800": 1}), SerializationError, "payload"),
    ("payload-nul", _submit(payload={"s": "a\x00b"}), SerializationError, "payload"),
    ("payload-key-nul", _submit(payload={"a\x00": 1}), SerializationError, "payload"),
    ("payload-deep", _submit(payload=_deep(100_000)), SerializationError, "payload"),
    ("metadata-surrogate", _submit(metadata={"m": "\ud800"}), SerializationError, "metadata"),
    ("metadata-nul", _submit(metadata={"m": "\x00"}), SerializationError, "metadata"),
    ("keyed-payload-nul", _submit(key="fresh", payload="\x00"), SerializationError, "payload"),
]


@pytest.mark.parametrize(
    ("call", "error", "argument"),
    [case[1:] for case in PORTABLE_CASES],
    ids=[case[0] for case in PORTABLE_CASES],
)
async def test_a_value_postgres_cannot_store_is_refused_on_both(
    store: TaskStore,
    dialect: str,
    db_target: str,
    call: Call,
    error: type[Exception],
    argument: str,
) -> None:
    await _seed(store)
    before = count_rows(dialect, db_target)
    with pytest.raises(error) as info:
        await call(store)
    assert type(info.value) is error
    assert argument in str(info.value), f"{str(info.value)!r} does not name {argument!r}"
    assert count_rows(dialect, db_target) == before


async def test_the_limits_themselves_are_accepted_on_both(store: TaskStore) -> None:
    edge = await store.submit(
        name="n" * 1000,
        queue="q" * 1000,
        key="k" * 1000,
        priority=INT4_MAX,
        max_attempts=INT4_MAX,
        correlation_id="é" * 500,  # 1,000 bytes in UTF-8
        payload={
            "emoji": "😀",  # a surrogate pair once escaped: valid
            "escaped": "\\u0000 and \\ud800",  # backslashes, not NUL or a surrogate
            "deep": _deep(200),
        },
    )
    low = await store.submit(name="low", priority=-(2**31))
    again = await store.get(edge.id)
    assert again is not None and again.payload == edge.payload
    assert again.priority == INT4_MAX and again.correlation_id == "é" * 500
    got_low = await store.get(low.id)
    assert got_low is not None and got_low.priority == -(2**31)


async def _running(store: TaskStore) -> str:
    task = await store.submit(name="owned")
    (claimed,) = await store.claim(queues=["default"], worker_id="w", names=["owned"])
    assert claimed.id == task.id
    return task.id


OWNED_CASES: list[tuple[str, Callable[[TaskStore, str], Awaitable[Any]], type[Exception], str]] = [
    (
        "progress-message-nul",
        lambda s, i: s.progress(task_id=i, worker_id="w", progress=0.5, message="a\x00"),
        ValueError,
        "message",
    ),
    (
        "progress-message-surrogate",
        lambda s, i: s.progress(task_id=i, worker_id="w", progress=None, message="\ud800"),
        ValueError,
        "message",
    ),
    (
        "complete-result-surrogate",
        lambda s, i: s.complete(task_id=i, worker_id="w", result={"r": "\ud800"}),
        SerializationError,
        "result",
    ),
    (
        "succeed-result-nul",
        lambda s, i: s.succeed(task_id=i, worker_id="w", result=["\x00"]),
        SerializationError,
        "result",
    ),
    (
        "complete-result-deep",
        lambda s, i: s.complete(task_id=i, worker_id="w", result=_deep(100_000)),
        SerializationError,
        "result",
    ),
    (
        "fail-envelope-nul",
        lambda s, i: s.fail(
            task_id=i,
            worker_id="w",
            error={"type": "E", "code": "e", "message": "a\x00b", "retryable": False},
        ),
        SerializationError,
        "error",
    ),
    (
        "fail-envelope-surrogate-details",
        lambda s, i: s.fail(
            task_id=i,
            worker_id="w",
            error={"type": "E", "code": "e", "message": "m", "details": {"p": "\udc80"}},
        ),
        SerializationError,
        "error",
    ),
    (
        "fail-delay-too-long",
        lambda s, i: s.fail(task_id=i, worker_id="w", error={"message": "m"}, delay_ms=2**63),
        ValueError,
        "delay_ms",
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "argument"),
    [case[1:] for case in OWNED_CASES],
    ids=[case[0] for case in OWNED_CASES],
)
async def test_an_owned_write_postgres_cannot_store_changes_nothing(
    store: TaskStore,
    call: Callable[[TaskStore, str], Awaitable[Any]],
    error: type[Exception],
    argument: str,
) -> None:
    task_id = await _running(store)
    before = await store.get(task_id)
    with pytest.raises(error) as info:
        await call(store, task_id)
    assert type(info.value) is error
    assert argument in str(info.value), f"{str(info.value)!r} does not name {argument!r}"
    assert await store.get(task_id) == before


async def test_submit_many_names_the_item_with_an_unportable_value(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    before = count_rows(dialect, db_target)
    with pytest.raises(ValueError) as info:
        await store.submit_many([GOOD, {"name": "ok", "queue": "q" * 5000}, GOOD])
    assert "tasks[1]" in str(info.value) and "queue" in str(info.value)
    with pytest.raises(SerializationError) as info_json:
        await store.submit_many([GOOD, GOOD, {"name": "ok", "payload": "\ud800"}])
    assert "tasks[2]" in str(info_json.value) and "payload" in str(info_json.value)
    assert count_rows(dialect, db_target) == before
