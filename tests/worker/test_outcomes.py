"""docs/protocol.md §6.4-6.5, §8.6: how the end of a handler call is recorded, and retry backoff."""

from __future__ import annotations

import math
import random
import time
from typing import Any

import pytest
from cairnq import errors as upstream_errors
from cairnq._backoff import retry_delay_ms as upstream_retry_delay_ms

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.errors import LostLease, TaskError
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker, backoff_delay_ms
from tests.support.worker import SQLITE_ONLY, ErrorLog, running, wait_all, wait_status

pytestmark = pytest.mark.timeout(60)


def make_worker(store: TaskStore, errors: ErrorLog, **kw: Any) -> Worker:
    kw.setdefault("poll_interval_ms", 50)
    kw.setdefault("retry_backoff_ms", 20)
    return Worker(store, ["default"], on_error=errors, **kw)


async def test_return_value_is_the_result(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = make_worker(store, errors)

    @worker.task
    async def echo(ctx: TaskContext, payload: Any) -> Any:
        return {"got": payload, "attempt": ctx.attempt}

    @worker.task
    async def nothing(ctx: TaskContext) -> None:
        return None

    payload = {"s": "héllo", "n": [1, 2.5, None, True]}
    a = await client.submit("echo", payload)
    b = await client.submit("nothing")
    async with running(worker):
        done_a, done_b = await wait_all(store, [a.id, b.id])
    assert done_a.status == "succeeded"
    assert done_a.result == {"got": payload, "attempt": 1}
    assert done_a.progress == 1.0
    assert done_a.error is None
    assert done_a.attempt == 1
    assert done_a.worker_id == worker.worker_id
    assert done_a.completed_at_ms is not None
    assert done_a.lease_until_ms is None
    assert (done_b.status, done_b.result) == ("succeeded", None)
    assert not errors.calls, errors


async def test_task_error_records_its_own_envelope(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = make_worker(store, errors)

    @worker.task
    async def permanent(ctx: TaskContext) -> None:
        raise TaskError("no such invoice", code="x", retryable=False, details={"invoice": 7})

    task = await client.submit("permanent", max_attempts=3)
    async with running(worker):
        done = await wait_status(store, task.id)
    assert done.status == "failed"
    assert done.attempt == 1, "a non-retryable TaskError must not be retried"
    assert done.error == {
        "type": "TaskError",
        "code": "x",
        "message": "no such invoice",
        "retryable": False,
        "details": {"invoice": 7},
    }
    assert not errors.calls, errors


@SQLITE_ONLY
async def test_retryable_task_error_is_retried(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = make_worker(store, errors)
    attempts: list[int] = []

    @worker.task
    async def flaky(ctx: TaskContext) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt < 2:
            raise TaskError("try again", code="busy", retryable=True, type="Busy")
        return "ok"

    task = await client.submit("flaky", max_attempts=3)
    async with running(worker):
        done = await wait_status(store, task.id)
    assert (done.status, done.result, done.attempt) == ("succeeded", "ok", 2)
    assert attempts == [1, 2]


@pytest.mark.timing
async def test_other_exceptions_retry_with_backoff_then_fail(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = make_worker(store, errors, retry_backoff_ms=100, retry_backoff_max_ms=10_000)
    started_ms: list[int] = []
    rows_seen: list[Any] = []

    @worker.task
    async def broken(ctx: TaskContext) -> None:
        started_ms.append(int(time.time() * 1000))
        if ctx.attempt > 1:
            rows_seen.append(await store.get(ctx.task_id))
        raise ValueError(f"boom {ctx.attempt}")

    task = await client.submit("broken", max_attempts=3)
    async with running(worker):
        done = await wait_status(store, task.id)
    assert done.status == "failed"
    assert done.attempt == 3
    assert len(started_ms) == 3
    traceback = done.error.pop("details")["traceback"]
    assert traceback.endswith("ValueError: boom 3\n")
    assert done.error == {
        "type": "ValueError",
        "code": "handler_error",
        "message": "boom 3",
        "retryable": True,
    }
    # While running again, the row carries the previous attempt's error.
    assert rows_seen[0].error["message"] == "boom 1"
    assert rows_seen[0].progress is None and rows_seen[0].message is None
    # Equal jitter: attempt 1 waits [50, 100) ms, attempt 2 waits [100, 200) ms.
    gap1 = started_ms[1] - started_ms[0]
    gap2 = started_ms[2] - started_ms[1]
    assert gap1 >= 50 - 2, started_ms
    assert gap2 >= 100 - 2, started_ms
    assert gap1 < 5_000 and gap2 < 5_000, started_ms
    assert not errors.calls, errors


async def test_unserializable_result_fails_permanently(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = make_worker(store, errors)

    @worker.task
    async def returns_set(ctx: TaskContext) -> Any:
        return {1, 2, 3}

    @worker.task
    async def returns_nan(ctx: TaskContext) -> Any:
        return {"score": math.nan}

    a = await client.submit("returns_set", max_attempts=3)
    b = await client.submit("returns_nan", max_attempts=3)
    async with running(worker):
        done = await wait_all(store, [a.id, b.id])
    for task in done:
        assert task.status == "failed", task
        assert task.attempt == 1, "a deterministic encoding failure must not be retried"
        assert task.result is None
        assert task.error["code"] == "unserializable_result"
        assert task.error["type"] == "SerializationError"
        assert task.error["retryable"] is False


async def test_ctx_succeed_then_return_settles_once(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = make_worker(store, errors)
    seen: dict[str, Any] = {}

    @worker.task
    async def early(ctx: TaskContext) -> str:
        first = await ctx.succeed({"early": True})
        seen["first"] = first
        seen["settled"] = ctx.settled
        seen["second"] = await ctx.succeed({"again": True})
        seen["fail_after"] = await ctx.fail("too late")
        try:
            await ctx.progress(0.5)
        except LostLease:
            seen["progress_after"] = "LostLease"
        return "ignored"

    task = await client.submit("early")
    async with running(worker):
        done = await wait_status(store, task.id)
    assert (done.status, done.result) == ("succeeded", {"early": True})
    assert seen["first"] is not None and seen["first"].status == "succeeded"
    assert seen["settled"] is True
    assert seen["second"] is None
    assert seen["fail_after"] is None
    assert seen["progress_after"] == "LostLease"
    assert not errors.calls, errors


@SQLITE_ONLY
async def test_ctx_fail_then_raise_settles_once(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = make_worker(store, errors)

    @worker.task
    async def gives_up(ctx: TaskContext) -> None:
        await ctx.fail("bad input", retryable=False)
        raise RuntimeError("raised after failing")

    task = await client.submit("gives_up", max_attempts=3)
    async with running(worker):
        done = await wait_status(store, task.id)
    assert done.status == "failed"
    assert done.attempt == 1
    assert done.error == {
        "type": "TaskError",
        "code": "task_error",
        "message": "bad input",
        "retryable": False,
        "details": {},
    }
    assert not errors.calls, errors


@SQLITE_ONLY
async def test_ctx_fail_retryable_requeues_with_backoff(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = make_worker(store, errors, retry_backoff_ms=10)
    attempts: list[int] = []

    @worker.task
    async def soft(ctx: TaskContext) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            row = await ctx.fail("later")
            assert row is not None and row.status == "queued"
            assert row.run_at_ms >= row.updated_at_ms
            return "ignored"
        return "second"

    task = await client.submit("soft", max_attempts=2)
    async with running(worker):
        done = await wait_status(store, task.id)
    assert (done.status, done.result, done.attempt) == ("succeeded", "second", 2)
    assert attempts == [1, 2]


def _error_pair(kind: str) -> tuple[Any, Any]:
    """(what our handler passes to ctx.fail, the same thing in cairnq 0.15.1's types)."""
    if kind == "str":
        return "plain reason", "plain reason"
    if kind == "TaskError":
        kw: dict[str, Any] = {"code": "t", "retryable": True, "details": {"a": 1}}
        return TaskError("typed", **kw), upstream_errors.TaskError("typed", **kw)
    if kind == "exception":
        return ValueError("from an exception"), ValueError("from an exception")
    envelope = {
        "type": "Custom",
        "code": "custom",
        "message": "whole envelope",
        "retryable": False,
        "details": {"k": [1]},
    }
    return envelope, dict(envelope)


@pytest.mark.parametrize(
    "kind",
    [
        "str",
        "TaskError",
        pytest.param(
            "exception",
        ),
        "envelope",
    ],
)
@SQLITE_ONLY
async def test_ctx_fail_envelope_matches_upstream(
    store: TaskStore, client: CairnQ, errors: ErrorLog, kind: str
) -> None:
    """`ctx.fail(x, retryable=False)` stores what cairnq 0.15.1's `as_envelope` builds."""
    ours, theirs = _error_pair(kind)
    worker = make_worker(store, errors)

    @worker.task
    async def fails(ctx: TaskContext) -> None:
        await ctx.fail(ours, retryable=False)

    task = await client.submit("fails", max_attempts=1)
    async with running(worker):
        done = await wait_status(store, task.id)
    expected, _ = upstream_errors.as_envelope(theirs, False)
    assert done.status == "failed"
    assert done.error == expected


# -- backoff -------------------------------------------------------------------------------


def test_backoff_equal_jitter_bounds() -> None:
    base, cap = 1000, 30_000
    for attempt in range(1, 12):
        window = min(cap, base * 2 ** (attempt - 1))
        assert backoff_delay_ms(attempt, base, cap, rand=0.0) == window // 2
        top = backoff_delay_ms(attempt, base, cap, rand=0.999999999)
        assert window // 2 <= top < window or window <= 1
        for _ in range(200):
            d = backoff_delay_ms(attempt, base, cap)
            assert window // 2 <= d < window, (attempt, d)
    # The cap holds for huge attempt numbers.
    assert 15_000 <= backoff_delay_ms(60, base, cap) < 30_000


def test_backoff_base_zero_disables_delay() -> None:
    for attempt in (1, 2, 10):
        assert backoff_delay_ms(attempt, 0, 30_000) == 0
        assert backoff_delay_ms(attempt, 0, 30_000, rand=0.99) == 0


def test_backoff_matches_upstream() -> None:
    rng = random.Random(1234)
    for _ in range(500):
        attempt = rng.randint(0, 20)
        base = rng.choice([0, 1, 7, 100, 1000, 5000])
        cap = rng.choice([1, 50, 1000, 30_000, 10**6])
        r = rng.random()
        assert backoff_delay_ms(attempt, base, cap, rand=r) == upstream_retry_delay_ms(
            attempt, base_ms=base, max_ms=cap, rand=lambda r=r: r
        ), (attempt, base, cap, r)


@SQLITE_ONLY
async def test_retry_backoff_zero_redelivers_at_once(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    worker = make_worker(store, errors, retry_backoff_ms=0)

    @worker.task
    async def always(ctx: TaskContext) -> None:
        raise RuntimeError("nope")

    task = await client.submit("always", max_attempts=3)
    async with running(worker):
        done = await wait_status(store, task.id)
    assert (done.status, done.attempt) == ("failed", 3)
