"""The store's worker-side and listing operations at the edges of their input: each bad
argument is refused with a ValueError naming it, the same on both dialects, and the
row it would have written is left as it was (docs/protocol.md §4.6, §6).

Before these checks, the values below reached the driver: a NaN lease failed with
"cannot convert float NaN to integer" on SQLite and "bigint out of range" on Postgres,
a huge limit with OverflowError or NumericValueOutOfRange, a lease of 0 or -1 ms was
written as a lease already over, a progress of 5 was stored as 500% done, a string
`queues` claimed from one-letter queues, and `fail(error="boom")` complained about a
"dictionary update sequence".
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from cairnqd.store.base import TaskStore
from tests.support.store import count_rows

INT8_MAX = 2**63 - 1

Owned = Callable[[TaskStore, str], Awaitable[Any]]


async def _running(store: TaskStore) -> str:
    task = await store.submit(name="owned")
    (claimed,) = await store.claim(queues=["default"], worker_id="w", names=["owned"])
    assert claimed.id == task.id
    return task.id


def _heartbeat(lease_ms: Any) -> Owned:
    return lambda s, i: s.heartbeat(task_id=i, worker_id="w", lease_ms=lease_ms)


def _batch(lease_ms: Any) -> Owned:
    return lambda s, i: s.heartbeat_batch(task_ids=[i], worker_id="w", lease_ms=lease_ms)


def _progress(value: Any) -> Owned:
    return lambda s, i: s.progress(task_id=i, worker_id="w", progress=value, message=None)


def _fail(error: Any) -> Owned:
    return lambda s, i: s.fail(task_id=i, worker_id="w", error=error)


OWNED_CASES: list[tuple[str, Owned, str]] = [
    ("heartbeat-lease-nan", _heartbeat(math.nan), "lease_ms"),
    ("heartbeat-lease-inf", _heartbeat(math.inf), "lease_ms"),
    ("heartbeat-lease-int8", _heartbeat(2**63), "lease_ms"),
    ("heartbeat-lease-text", _heartbeat("30000"), "lease_ms"),
    ("heartbeat-lease-0", _heartbeat(0), "lease_ms"),
    ("heartbeat-lease-negative", _heartbeat(-1), "lease_ms"),
    ("batch-lease-nan", _batch(math.nan), "lease_ms"),
    ("batch-lease-int8", _batch(2**63), "lease_ms"),
    ("batch-lease-0", _batch(0), "lease_ms"),
    ("progress-5", _progress(5), "progress"),
    ("progress-negative", _progress(-0.25), "progress"),
    ("progress-past-1", _progress(1.0000001), "progress"),
    ("progress-past-float", _progress(2**1100), "progress"),
    ("progress-text", _progress("0.5"), "progress"),
    ("fail-error-text", _fail("boom"), "error"),
    ("fail-error-none", _fail(None), "error"),
    ("fail-error-list", _fail([["message", "m"]]), "error"),
    (
        "heartbeat-task-id-nul",
        lambda s, i: s.heartbeat(task_id=i + "\x00", worker_id="w"),
        "task_id",
    ),
    (
        "complete-task-id-surrogate",
        lambda s, i: s.complete(task_id=i + "\ud800", worker_id="w", result=None),
        "task_id",
    ),
    (
        "fail-worker-id-nul",
        lambda s, i: s.fail(task_id=i, worker_id="w\x00", error={"message": "m"}),
        "worker_id",
    ),
    (
        "progress-worker-id-surrogate",
        lambda s, i: s.progress(task_id=i, worker_id="\udc80", progress=0.5, message=None),
        "worker_id",
    ),
    (
        "batch-id-nul",
        lambda s, i: s.heartbeat_batch(task_ids=[i, "x\x00"], worker_id="w"),
        "task_ids[1]",
    ),
    (
        "cancel-requests-id-surrogate",
        lambda s, i: s.cancel_requests(task_ids=["\ud800"], worker_id="w"),
        "task_ids[0]",
    ),
]


@pytest.mark.parametrize(
    ("call", "argument"),
    [case[1:] for case in OWNED_CASES],
    ids=[case[0] for case in OWNED_CASES],
)
async def test_a_bad_owned_write_is_refused_by_name_and_changes_nothing(
    store: TaskStore, call: Owned, argument: str
) -> None:
    task_id = await _running(store)
    before = await store.get(task_id)
    with pytest.raises(ValueError) as info:
        await call(store, task_id)
    assert type(info.value) is ValueError
    assert argument in str(info.value), f"{str(info.value)!r} does not name {argument!r}"
    assert await store.get(task_id) == before


async def test_the_progress_range_and_lease_floor_themselves_are_taken(store: TaskStore) -> None:
    task_id = await _running(store)
    for value in (0, 0.0, 0.5, 1, 1.0):
        task = await store.progress(task_id=task_id, worker_id="w", progress=value, message=None)
        assert task.progress == value
    assert await store.heartbeat_batch(task_ids=[task_id], worker_id="w", lease_ms=60_000) == {
        task_id: False
    }
    renewed = await store.heartbeat(task_id=task_id, worker_id="w", lease_ms=1)
    assert renewed.status == "running" and renewed.lease_until_ms is not None


async def test_fail_still_takes_an_envelope_that_will_not_encode(store: TaskStore) -> None:
    """Reduced to its scalar fields, as before; a NaN among them is dropped too, where it
    used to fail the reduced envelope as well (docs/protocol.md §4.5)."""
    task_id = await _running(store)
    failed = await store.fail(
        task_id=task_id,
        worker_id="w",
        error={"message": "m", "code": "c", "score": math.nan, "details": {"s": {1}}},
        retryable=False,
    )
    assert failed.status == "failed"
    assert failed.error == {"message": "m", "code": "c"}


# -- claims ----------------------------------------------------------------------------

CLAIM_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("limit-nan", {"limit": math.nan}, "limit"),
    ("limit-int8", {"limit": 2**63}, "limit"),
    ("limit-float", {"limit": 1.0}, "limit"),
    ("limit-text", {"limit": "1"}, "limit"),
    ("queues-text", {"queues": "default"}, "queues"),
    ("names-text", {"names": "owned"}, "names"),
]


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [case[1:] for case in CLAIM_CASES],
    ids=[case[0] for case in CLAIM_CASES],
)
async def test_a_bad_claim_is_refused_by_name_and_claims_nothing(
    store: TaskStore, kwargs: dict[str, Any], argument: str
) -> None:
    task = await store.submit(name="owned")
    arguments = {"queues": ["default"], "worker_id": "w", "names": ["owned"], **kwargs}
    with pytest.raises(ValueError) as info:
        await store.claim(**arguments)
    assert argument in str(info.value), f"{str(info.value)!r} does not name {argument!r}"
    again = await store.get(task.id)
    assert again is not None and again.status == "queued" and again.attempt == 0


async def test_a_claim_of_no_rows_still_claims_none(store: TaskStore) -> None:
    """A limit of 0 or below asks for nothing (docs/protocol.md §6.2), and the largest
    limit is a limit like any other."""
    task = await store.submit(name="owned")
    for limit in (0, -1):
        assert await store.claim(queues=["default"], worker_id="w", limit=limit) == []
    claimed = await store.claim(queues=("default",), worker_id="w", limit=INT8_MAX)
    assert [t.id for t in claimed] == [task.id]


# -- reads with limits -------------------------------------------------------------------

READ_CASES: list[tuple[str, Callable[[TaskStore], Awaitable[Any]], str]] = [
    ("dependents-limit-int8", lambda s: s.dependents("task_x", limit=2**63), "limit"),
    ("graph-limit-int8", lambda s: s.graph("task_x", limit=INT8_MAX), "limit"),
    ("waiting-limit-int8", lambda s: s.waiting(limit=2**63), "limit"),
    ("waiting-offset-int8", lambda s: s.waiting(offset=2**63), "offset"),
    ("purge-status-list", lambda s: s.purge(status=["failed"]), "status"),
    ("count-purgeable-status-list", lambda s: s.count_purgeable(status=["failed"]), "status"),
]


@pytest.mark.parametrize(
    ("call", "argument"),
    [case[1:] for case in READ_CASES],
    ids=[case[0] for case in READ_CASES],
)
async def test_a_bad_read_argument_is_refused_by_name(
    store: TaskStore,
    dialect: str,
    db_target: str,
    call: Callable[[TaskStore], Awaitable[Any]],
    argument: str,
) -> None:
    await store.submit(name="seed")
    before = count_rows(dialect, db_target)
    with pytest.raises(ValueError) as info:
        await call(store)
    assert argument in str(info.value), f"{str(info.value)!r} does not name {argument!r}"
    assert count_rows(dialect, db_target) == before


async def test_the_largest_read_limits_are_taken(store: TaskStore) -> None:
    parent = await store.submit(name="parent")
    child = await store.submit(name="child", after=[parent.id])
    assert [t.id for t in await store.dependents(parent.id, limit=INT8_MAX)] == [child.id]
    graph = await store.graph(child.id, limit=INT8_MAX - 1)
    assert not graph.truncated
    waiting, matched = await store.waiting(limit=INT8_MAX, offset=0)
    assert [t.id for t in waiting] == [child.id] and matched == 1
    assert (await store.waiting(offset=INT8_MAX))[0] == []


# -- backpressure ------------------------------------------------------------------------

GATE_CASES: list[tuple[str, Any, Any, str]] = [
    ("depth-int8", 2**63, 600_000, "max_queue_depth"),
    ("depth-per-queue-int8", {"q": 2**70}, 600_000, "max_queue_depth"),
    ("depth-per-queue-empty-name", {"": 5}, 600_000, "max_queue_depth"),
    ("depth-per-queue-int-name", {5: 5}, 600_000, "max_queue_depth"),
    ("wait-nan", 5, math.nan, "max_queue_wait_ms"),
    ("wait-inf", 5, math.inf, "max_queue_wait_ms"),
    ("wait-text", 5, "1000", "max_queue_wait_ms"),
    ("wait-huge", 5, 10**30, "max_queue_wait_ms"),
]


@pytest.mark.parametrize(
    ("depth", "wait_ms", "argument"),
    [case[1:] for case in GATE_CASES],
    ids=[case[0] for case in GATE_CASES],
)
async def test_a_bad_backpressure_setting_is_refused_by_name(
    store: TaskStore, depth: Any, wait_ms: Any, argument: str
) -> None:
    """Refused when set: a NaN wait let a full queue hold its submits forever (no wait
    is ever `>=` NaN), a depth past 64 bits failed every submit to the queue with
    `queue_depth`'s own error, and a depth keyed by no queue name matched nothing."""
    with pytest.raises(ValueError) as info:
        store.use_backpressure(depth, max_queue_wait_ms=wait_ms)
    assert argument in str(info.value), f"{str(info.value)!r} does not name {argument!r}"
    task = await store.submit(name="ungated")  # no gate was installed
    assert task.status == "queued"


async def test_the_largest_backpressure_setting_admits(store: TaskStore) -> None:
    store.use_backpressure(INT8_MAX, max_queue_wait_ms=100 * 365 * 86_400_000)
    store.use_backpressure({"default": INT8_MAX}, max_queue_wait_ms=0)
    assert (await store.submit(name="admitted")).status == "queued"
