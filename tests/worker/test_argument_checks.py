"""Bad arguments to `Worker`, `CairnQ`, `TaskRegistry` and `TaskContext` are refused at
the call that received them, with an error naming the argument, on both dialects
(docs/protocol.md §8.13): never taken, to fail later where nobody sees it (a worker
whose every claim fails and reports only to an `on_error` it was not given).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.models import Task
from cairnqd.registry import TaskRegistry
from cairnqd.store.arguments import MAX_DURATION_MS, MAX_WORKER_COUNT
from cairnqd.store.base import TaskStore
from cairnqd.store.browse import TaskQuery
from cairnqd.store.operator import TaskFilter
from cairnqd.worker import MIN_LEASE_MS, Worker
from tests.support.waiting import wait_for_async
from tests.support.worker import (
    DEADLINE_S,
    ErrorLog,
    eventually,
    running,
    wait_status,
    wrap_method,
)

pytestmark = pytest.mark.timeout(60)

Case = tuple[Callable[[], Any], type[Exception], str]


def _mismatch(kind: type[Exception], message: str, outcome: Any) -> str | None:
    """What a case did, when it was not raising `kind` with `message`; None when it was.
    `outcome` is the exception it raised, or `_Returned` holding what it returned."""
    if isinstance(outcome, _Returned):
        return f"returned {outcome.value!r}"
    if type(outcome) is not kind or not re.search(message, str(outcome)):
        return f"{type(outcome).__name__}: {outcome}"
    return None


@dataclasses.dataclass
class _Returned:
    value: Any


def _mismatches(cases: dict[str, Case]) -> dict[str, str]:
    """Each case that did not raise its exception with its message: what it did."""
    wrong: dict[str, str] = {}
    for label, (call, kind, message) in cases.items():
        try:
            outcome: Any = _Returned(call())
        except Exception as exc:
            outcome = exc
        if (said := _mismatch(kind, message, outcome)) is not None:
            wrong[label] = said
    return wrong


async def _async_mismatches(
    cases: Mapping[str, tuple[Any, type[Exception], str]],
) -> dict[str, str]:
    wrong: dict[str, str] = {}
    for label, (make, kind, message) in cases.items():
        try:
            outcome: Any = _Returned(await make())
        except Exception as exc:
            outcome = exc
        if (said := _mismatch(kind, message, outcome)) is not None:
            wrong[label] = said
    return wrong


def _worker_cases(store: TaskStore) -> dict[str, Case]:
    def make(**kw: Any) -> Callable[[], Worker]:
        return lambda: Worker(store, **kw)

    max_ms = str(MAX_DURATION_MS)
    return {
        # Queues: each one a name a submit could have given a task.
        "queue None": (make(queues=[None]), ValueError, r"^queues\[0\] must be a non-empty"),
        "queue empty": (make(queues=["a", ""]), ValueError, r"^queues\[1\] must be a non-empty"),
        "queue NUL": (make(queues=["q\x00"]), ValueError, r"^queues\[0\] must not contain a NUL"),
        "queue surrogate": (make(queues=["\ud800"]), ValueError, r"^queues\[0\] contains a lone"),
        "queue too long": (make(queues=["q" * 1001]), ValueError, r"^queues\[0\] is 1001 bytes"),
        "queues bytes": (make(queues=b"ab"), ValueError, r"^queues must be a queue name or"),
        "queues None": (make(queues=None), ValueError, r"^queues must be a queue name or"),
        "queues int": (make(queues=5), ValueError, r"^queues must be a queue name or"),
        # Durations: what the store takes, and types.
        "lease huge": (make(lease_ms=10**30), ValueError, rf"^lease_ms must be <= {max_ms}"),
        "lease 1": (make(lease_ms=1), ValueError, rf"^lease_ms must be >= {MIN_LEASE_MS}, got 1"),
        "lease float": (make(lease_ms=30_000.0), ValueError, r"^lease_ms must be an integer"),
        "poll huge": (make(poll_interval_ms=10**30), ValueError, r"^poll_interval_ms must be <="),
        "poll nan": (make(poll_interval_ms=math.nan), ValueError, r"^poll_interval_ms must be an"),
        "max_run huge": (make(max_run_ms=10**30), ValueError, r"^max_run_ms must be <="),
        "backoff huge": (
            make(retry_backoff_ms=10**30),
            ValueError,
            r"^retry_backoff_ms must be <=",
        ),
        "backoff max huge": (
            make(retry_backoff_max_ms=10**30),
            ValueError,
            r"^retry_backoff_max_ms must be <=",
        ),
        "backoff str": (make(retry_backoff_ms="1"), ValueError, r"^retry_backoff_ms must be an"),
        "backoff nan": (make(retry_backoff_ms=math.nan), ValueError, r"^retry_backoff_ms must be"),
        "backoff max nan": (
            make(retry_backoff_max_ms=math.nan),
            ValueError,
            r"^retry_backoff_max_ms must be an integer",
        ),
        "backoff negative": (
            make(retry_backoff_ms=-1),
            ValueError,
            r"^retry_backoff_ms must be >=",
        ),
        "queue wait nan": (
            make(max_queue_wait_ms=math.nan),
            ValueError,
            r"^max_queue_wait_ms must be an integer",
        ),
        "queue wait nan, limited": (
            make(max_queue_depth=5, max_queue_wait_ms=math.nan),
            ValueError,
            r"^max_queue_wait_ms must be an integer",
        ),
        "cancel_grace nan": (make(cancel_grace=math.nan), ValueError, r"^cancel_grace must be"),
        "cancel_grace inf": (make(cancel_grace=math.inf), ValueError, r"^cancel_grace must be"),
        # Counts.
        "concurrency huge": (make(concurrency=10**30), ValueError, r"^concurrency must be <="),
        "concurrency 1.5": (make(concurrency=1.5), ValueError, r"^concurrency must be an integer"),
        "prefetch huge": (make(prefetch=10**30), ValueError, r"^prefetch must be <="),
        # Hooks and mappings.
        "on_error 5": (make(on_error=5), ValueError, r"^on_error must be callable or None, got 5"),
        "resources list": (make(resources=["db"]), ValueError, r"^resources must be a mapping"),
        "resource name": (make(resources={"": 1}), ValueError, r"^resources keys must be"),
        "resource huge": (make(resources={"db": 10**30}), ValueError, r"^resources\['db'\] must"),
    }


async def test_the_worker_refuses_bad_settings_when_built(store: TaskStore) -> None:
    assert _mismatches(_worker_cases(store)) == {}
    # None of them left a gate or limits on the caller's store.
    assert getattr(store, "_gate", None) is None


async def test_the_factories_refuse_what_the_constructor_refuses(
    dialect: str, db_target: str
) -> None:
    # Any: these calls pass what the annotations forbid, as a caller without mypy may.
    factory: Any = Worker.sqlite if dialect == "sqlite" else Worker.postgres
    cases: dict[str, Case] = {
        "queue None": (lambda: factory(db_target, queues=[None]), ValueError, r"^queues\[0\]"),
        "lease huge": (lambda: factory(db_target, lease_ms=10**30), ValueError, r"^lease_ms"),
        "backoff huge": (
            lambda: factory(db_target, retry_backoff_ms=10**30),
            ValueError,
            r"^retry_backoff_ms",
        ),
    }
    assert _mismatches(cases) == {}


async def test_the_smallest_lease_still_runs_tasks(store: TaskStore, client: CairnQ) -> None:
    """MIN_LEASE_MS is a lease a worker can keep: its renewals land before the lease
    guard's stop point, so a handler longer than the lease finishes."""
    worker = Worker(store, lease_ms=MIN_LEASE_MS, poll_interval_ms=20)

    async def slow(ctx: TaskContext) -> str:
        await asyncio.sleep(MIN_LEASE_MS * 3 / 1000)
        return "done"

    worker.register("slow", slow)
    task = await client.submit("slow", max_attempts=1)
    async with running(worker):
        done = await wait_status(store, task.id)
    assert (done.status, done.result, done.attempt) == ("succeeded", "done", 1)


async def test_run_refuses_a_concurrency_the_constructor_would(store: TaskStore) -> None:
    worker: Any = Worker(store, poll_interval_ms=20)
    worker.register("job", lambda ctx: None)
    cases = {
        "1.5": (lambda: worker.run(concurrency=1.5), ValueError, r"^concurrency must be an"),
        "str": (lambda: worker.run(concurrency="2"), ValueError, r"^concurrency must be an"),
        "bool": (lambda: worker.run(concurrency=True), ValueError, r"^concurrency must be an"),
        "huge": (lambda: worker.run(concurrency=10**30), ValueError, r"^concurrency must be <="),
    }
    assert await asyncio.wait_for(_async_mismatches(cases), 10) == {}


async def test_task_names_follow_the_submit_rule(store: TaskStore) -> None:
    worker = Worker(store)
    registry = TaskRegistry()

    def handler(ctx: TaskContext) -> None:
        return None

    bad = {
        "NUL": ("a\x00b", r"^task name must not contain a NUL"),
        "surrogate": ("\ud800", r"^task name contains a lone UTF-16 surrogate"),
        "10,000 characters": ("n" * 10_000, r"^task name is 10000 bytes in UTF-8; the limit"),
    }

    def registrations(name: str) -> dict[str, Callable[[], Any]]:
        return {
            "Worker.task": lambda: worker.task(name)(handler),
            "Worker.register": lambda: worker.register(name, handler),
            "TaskRegistry.task": lambda: registry.task(name)(handler),
            "TaskRegistry.register": lambda: registry.register(name, handler),
        }

    cases: dict[str, Case] = {}
    for label, (name, message) in bad.items():
        for how, call in registrations(name).items():
            cases[f"{how} {label}"] = (call, ValueError, message)
    cases["Worker batch huge"] = (
        lambda: worker.register("b", handler, batch=10**30),
        ValueError,
        r"^batch must be <=",
    )
    assert _mismatches(cases) == {}
    assert not worker.handlers and not registry.handlers


async def test_setters_refuse_what_the_constructor_would(store: TaskStore) -> None:
    worker = Worker(store)

    def set_to(attribute: str, value: Any) -> Callable[[], None]:
        return lambda: setattr(worker, attribute, value)

    cases: dict[str, Case] = {
        "claim_budget -1": (set_to("claim_budget", -1), ValueError, r"^claim_budget must be >="),
        "claim_budget 1.5": (set_to("claim_budget", 1.5), ValueError, r"^claim_budget must be an"),
        "claim_budget '3'": (set_to("claim_budget", "3"), ValueError, r"^claim_budget must be an"),
        "cancel_grace nan": (set_to("cancel_grace", math.nan), ValueError, r"^cancel_grace must"),
        "cancel_grace inf": (set_to("cancel_grace", math.inf), ValueError, r"^cancel_grace must"),
        "cancel_grace -1": (set_to("cancel_grace", -1), ValueError, r"^cancel_grace must"),
    }
    assert _mismatches(cases) == {}
    worker.claim_budget = 0
    worker.claim_budget = None
    worker.cancel_grace = 0.5
    assert (worker.claim_budget, worker.cancel_grace) == (None, 0.5)


async def test_claim_errors_without_on_error_reach_the_log_rate_limited(
    store: TaskStore, caplog: pytest.LogCaptureFixture
) -> None:
    failures = 0

    async def refuse(original: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal failures
        failures += 1
        raise RuntimeError("the claim broke")

    wrap_method(store, "claim_session", refuse)
    worker = Worker(store, poll_interval_ms=20)
    worker.register("job", lambda ctx: None)
    with caplog.at_level(logging.WARNING, logger="cairnqd.worker"):
        async with running(worker):
            await eventually(lambda: failures >= 3, what="three failed claims")
    lines = [r for r in caplog.records if "the claim broke" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "claim" in lines[0].getMessage() and lines[0].levelno == logging.WARNING

    # With a hook, the hook is told and the log is left alone.
    caplog.clear()
    failures = 0
    errors = ErrorLog()
    hooked = Worker(store, poll_interval_ms=20, on_error=errors)
    hooked.register("job", lambda ctx: None)
    with caplog.at_level(logging.WARNING, logger="cairnqd.worker"):
        async with running(hooked):
            await eventually(lambda: failures >= 2, what="two failed claims")
    assert [r for r in caplog.records if "the claim broke" in r.getMessage()] == []
    assert {i["phase"] for _, i in errors.calls} == {"claim"}


async def test_the_largest_backoff_the_store_takes_is_written(
    store: TaskStore, client: CairnQ
) -> None:
    """The bound is the store's: at it, a failure is written and the retry is due a
    century later, instead of the task staying running until its lease ends."""
    worker = Worker(
        store,
        poll_interval_ms=20,
        retry_backoff_ms=MAX_DURATION_MS,
        retry_backoff_max_ms=MAX_DURATION_MS,
    )

    async def flaky(ctx: TaskContext) -> None:
        raise RuntimeError("again later")

    worker.register("flaky", flaky)
    task = await client.submit("flaky", max_attempts=2)

    def written(found: Task | None) -> bool:
        return found is not None and found.attempt == 1 and found.status != "running"

    async with running(worker):
        retried = await wait_for_async(
            "the failure to be written", lambda: store.get(task.id), DEADLINE_S, accept=written
        )
    assert retried is not None and retried.status == "queued", retried
    assert retried.run_at_ms - retried.updated_at_ms >= MAX_DURATION_MS // 2


async def test_wait_refuses_bad_arguments(store: TaskStore, client: Any) -> None:
    """`client: Any`: the calls pass what the annotations forbid."""
    task = await client.submit("never.run")
    cases = {
        "timeout nan": (
            lambda: client.wait(task.id, timeout_ms=math.nan),
            ValueError,
            r"^timeout_ms must be an integer",
        ),
        "timeout inf": (
            lambda: client.wait(task.id, timeout_ms=math.inf),
            ValueError,
            r"^timeout_ms must be an integer",
        ),
        "timeout str": (
            lambda: client.wait(task.id, timeout_ms="100"),
            ValueError,
            r"^timeout_ms must be an integer",
        ),
        "timeout huge": (
            lambda: client.wait(task.id, timeout_ms=10**400),
            ValueError,
            r"^timeout_ms must be <=",
        ),
        "timeout -1": (
            lambda: client.wait(task.id, timeout_ms=-1),
            ValueError,
            r"^timeout_ms must be >= 0, got -1",
        ),
        "poll nan": (
            lambda: client.wait(task.id, poll_ms=math.nan),
            ValueError,
            r"^poll_ms must be an integer",
        ),
        "poll 0": (lambda: client.wait(task.id, poll_ms=0), ValueError, r"^poll_ms must be >= 1"),
        "max poll nan": (
            lambda: client.wait(task.id, max_poll_ms=math.nan),
            ValueError,
            r"^max_poll_ms must be an integer",
        ),
        "id None": (lambda: client.wait(None), ValueError, r"^task_id must be a non-empty string"),
        "id empty": (lambda: client.wait(""), ValueError, r"^task_id must be a non-empty string"),
        "key None": (
            lambda: client.wait_by_key(None),
            ValueError,
            r"^key must be a non-empty string, got None",
        ),
        "call timeout nan": (
            lambda: client.call("never.run", timeout_ms=math.nan),
            ValueError,
            r"^timeout_ms must be an integer",
        ),
    }
    assert await asyncio.wait_for(_async_mismatches(cases), 20) == {}
    # `call` checks before it submits: only the task above exists.
    assert [t.id for t in await client.list()] == [task.id]


async def test_list_and_purge_filters_are_checked_alike(store: Any, client: Any) -> None:
    """`Any`: the calls pass what the annotations forbid."""
    await client.submit("kept")
    cases = {
        "list queue NUL": (lambda: client.list(queue="a\x00"), ValueError, r"^queue must not"),
        "list queue int": (lambda: client.list(queue=5), ValueError, r"^queue must be a non-empty"),
        "list queue empty": (lambda: client.list(queue=""), ValueError, r"^queue must be a non"),
        "list name surrogate": (lambda: client.list(name="\ud800"), ValueError, r"^name contains"),
        "list root_id int": (lambda: client.list(root_id=5), ValueError, r"^root_id must be a"),
        "list correlation_id NUL": (
            lambda: client.list(correlation_id="c\x00"),
            ValueError,
            r"^correlation_id must not",
        ),
        "purge queue NUL": (lambda: client.purge(queue="\x00"), ValueError, r"^queue must not"),
        "purge queue int": (lambda: client.purge(queue=5), ValueError, r"^queue must be a non"),
        "purge name surrogate": (
            lambda: client.purge(name="\ud800"),
            ValueError,
            r"^name contains a lone",
        ),
        "count_purgeable name int": (
            lambda: store.count_purgeable(name=5),
            ValueError,
            r"^name must be a non-empty",
        ),
    }
    assert await _async_mismatches(cases) == {}
    assert [t.name for t in await client.list()] == ["kept"]


async def test_progress_is_a_fraction(store: TaskStore, client: CairnQ) -> None:
    """docs/protocol.md §2: `progress` is a fraction (1.0 after success)."""
    outcomes: dict[str, str] = {}
    worker = Worker(store, poll_interval_ms=20)

    async def report(ctx: TaskContext) -> None:
        refused: tuple[Any, ...] = (2.0, -1, 1.0000001, math.nan, "0.5", True)
        for value in refused:
            try:
                await ctx.progress(value)
            except Exception as exc:
                outcomes[repr(value)] = f"{type(exc).__name__}: {exc}"
            else:
                outcomes[repr(value)] = "written"
        for value in (0, 0.5, 1):
            await ctx.progress(value)
            outcomes[repr(value)] = "written"

    worker.register("report", report)
    task = await client.submit("report", max_attempts=1)
    async with running(worker):
        done = await wait_status(store, task.id)
    assert done.status == "succeeded", done.error
    fraction = "ValueError: progress must be a number from 0 to 1"
    assert outcomes == {
        "2.0": f"{fraction}, got 2.0",
        "-1": f"{fraction}, got -1",
        "1.0000001": f"{fraction}, got 1.0000001",
        "nan": f"{fraction}, got nan",
        "'0.5'": f"{fraction}, got '0.5'",
        "True": f"{fraction}, got True",
        "0": "written",
        "0.5": "written",
        "1": "written",
    }


async def test_the_client_refuses_a_bad_queue_wait(store: TaskStore) -> None:
    client: Any = CairnQ  # Any: built with what the annotations forbid
    cases: dict[str, Case] = {
        "nan": (
            lambda: client(store, max_queue_wait_ms=math.nan),
            ValueError,
            r"^max_queue_wait_ms must be an integer",
        ),
        "nan, limited": (
            lambda: client(store, max_queue_depth=3, max_queue_wait_ms=math.nan),
            ValueError,
            r"^max_queue_wait_ms must be an integer",
        ),
        "huge": (
            lambda: client(store, max_queue_depth=3, max_queue_wait_ms=10**30),
            ValueError,
            r"^max_queue_wait_ms must be <=",
        ),
    }
    assert _mismatches(cases) == {}


async def test_the_largest_counts_still_claim(store: TaskStore, client: CairnQ) -> None:
    """MAX_WORKER_COUNT is within what the claim takes: at it, every kind of draw (plain
    with prefetch, a batch, a resource) still claims and runs its tasks."""
    most = MAX_WORKER_COUNT
    worker = Worker(
        store, concurrency=most, prefetch=most, resources={"r": most}, poll_interval_ms=20
    )
    worker.register("plain", lambda ctx: "plain")
    worker.register("batched", lambda ctxs: {c.task_id: "batched" for c in ctxs}, batch=most)
    worker.register("drawn", lambda ctx: "drawn", resource="r")
    tasks = await client.submit_many([{"name": n} for n in ("plain", "batched", "drawn")])
    async with running(worker, concurrency=most):
        done = [await wait_status(store, t.id) for t in tasks]
    assert [(t.status, t.result) for t in done] == [
        ("succeeded", "plain"),
        ("succeeded", "batched"),
        ("succeeded", "drawn"),
    ]


async def test_the_operator_reads_check_their_filters_alike(store: Any) -> None:
    """The bulk actions' and the dashboard's reads by filter (store/tables): the same
    error on both dialects, where SQLite matched a string or NaN bound (or overflowed)
    and Postgres refused the statement. `store: Any`: the calls pass what the
    annotations forbid."""
    await store.submit(name="kept")
    queued = ["queued"]
    cases = {
        "count created str": (
            lambda: store.bulk.count(TaskFilter(queued, created_after_ms="x")),
            ValueError,
            r"^created_after_ms must be an integer",
        ),
        "count created nan": (
            lambda: store.bulk.count(TaskFilter(queued, created_before_ms=math.nan)),
            ValueError,
            r"^created_before_ms must be an integer",
        ),
        "count created huge": (
            lambda: store.bulk.count(TaskFilter(queued, created_after_ms=10**30)),
            ValueError,
            r"^created_after_ms must be <=",
        ),
        "ids after NUL": (
            lambda: store.bulk.ids(TaskFilter(queued), after_id="a\x00"),
            ValueError,
            r"^after_id must not contain a NUL",
        ),
        "ids after int": (
            lambda: store.bulk.ids(TaskFilter(queued), after_id=5),
            ValueError,
            r"^after_id must be a string, got 5",
        ),
        "browse from str": (
            lambda: store.dashboard.browse(TaskQuery(from_ms="x")),
            ValueError,
            r"^from_ms must be an integer",
        ),
        "browse to smallest": (
            lambda: store.dashboard.browse(TaskQuery(to_ms=-(2**63))),
            ValueError,
            r"^to_ms must be >=",
        ),
        "browse cursor id NUL": (
            lambda: store.dashboard.browse(TaskQuery(cursor=(5, "a\x00"))),
            ValueError,
            r"^cursor id must not contain a NUL",
        ),
        "failed ids error_type NUL": (
            lambda: store.dashboard.failed_group_ids("kept", "E\x00"),
            ValueError,
            r"^error_type must not contain a NUL",
        ),
        "failed ids after surrogate": (
            lambda: store.dashboard.failed_group_ids("kept", "", after_id="\ud800"),
            ValueError,
            r"^after_id contains a lone UTF-16 surrogate",
        ),
    }
    assert await _async_mismatches(cases) == {}
    # The valid forms still read.
    assert await store.bulk.count(TaskFilter(queued, created_after_ms=0)) == 1
    assert len(await store.bulk.ids(TaskFilter(queued), after_id="")) == 1
    assert [t.name for t in await store.dashboard.browse(TaskQuery(from_ms=0))] == ["kept"]
