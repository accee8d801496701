"""A handler that raises is visible: its traceback is stored in the error envelope's
details and each failed attempt is logged, rate-limited."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from cairnqd._failures import TRACEBACK_MAX_CHARS, FailureLog, format_traceback
from cairnqd.client import CairnQ
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.worker import SQLITE_ONLY, running, wait_status


def _explode(payload: Any) -> None:
    raise ValueError(f"bad input {payload['n']}")


@SQLITE_ONLY
async def test_the_traceback_is_stored_and_each_attempt_logged(
    store: TaskStore, client: CairnQ, caplog: pytest.LogCaptureFixture
) -> None:
    worker = Worker(store, retry_backoff_ms=1, retry_backoff_max_ms=1, poll_interval_ms=20)

    @worker.task("boom")
    async def boom(ctx: Any, payload: Any) -> None:
        _explode(payload)

    task = await client.submit("boom", {"n": 7}, max_attempts=2)
    with caplog.at_level(logging.INFO, logger="cairnqd.worker"):
        async with running(worker):
            done = await wait_status(store, task.id, "failed")
    assert done.error is not None
    assert (done.error["type"], done.error["message"]) == ("ValueError", "bad input 7")
    stored = done.error["details"]["traceback"]
    assert "Traceback (most recent call last)" in stored
    assert "in _explode" in stored and "ValueError: bad input 7" in stored

    records = [r for r in caplog.records if task.id in r.getMessage()]
    assert [r.levelname for r in records] == ["WARNING", "ERROR"]
    first, last = (r.getMessage() for r in records)
    assert "(boom) attempt 1/2 failed: ValueError: bad input 7; will retry at " in first
    assert "attempt 2/2 failed" in last and "no attempts left: failed" in last
    assert all(r.exc_info is not None for r in records), "the log carries the traceback"


@SQLITE_ONLY
async def test_a_flood_of_failures_is_rate_limited(
    store: TaskStore, client: CairnQ, caplog: pytest.LogCaptureFixture
) -> None:
    worker = Worker(store, concurrency=8, poll_interval_ms=20)

    @worker.task("boom")
    async def boom(ctx: Any, payload: Any) -> None:
        _explode(payload)

    tasks = [await client.submit("boom", {"n": i}, max_attempts=1) for i in range(40)]
    with caplog.at_level(logging.INFO, logger="cairnqd.worker"):
        async with running(worker):
            for task in tasks:
                await wait_status(store, task.id, "failed")
    logged = [r for r in caplog.records if "failed: ValueError" in r.getMessage()]
    assert len(logged) == 10, "the default burst is 10 records per 10 s"


class _Ctx:
    task_id, name, attempt = "task_x", "n", 1

    class task:
        max_attempts = 3


def test_held_back_failures_are_counted_in_the_next_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    failures = FailureLog(burst=2, window_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="cairnqd.worker"):
        for _ in range(5):
            failures.failed(_Ctx(), RuntimeError("x"), None)  # type: ignore[arg-type]
        now[0] = 10.0
        failures.failed(_Ctx(), RuntimeError("x"), None)  # type: ignore[arg-type]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3
    assert messages[-1].endswith("(3 more failure(s) not logged)")


def test_a_huge_traceback_keeps_its_end() -> None:
    try:
        raise KeyError("the bottom " + "x" * (2 * TRACEBACK_MAX_CHARS))
    except KeyError as exc:
        text = format_traceback(exc)
    assert len(text) <= TRACEBACK_MAX_CHARS + 30
    assert text.startswith("...(earlier frames cut)") and text.endswith("xxx'\n")
