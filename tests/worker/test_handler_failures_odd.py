"""Handlers that raise odd things: the task still ends at once, with an error that says
what happened (docs/protocol.md §4.5). An exception whose `str()` fails, text Postgres
cannot store, a `KeyboardInterrupt` or `SystemExit` of the handler's own, a huge
message, and envelopes that are not quite envelopes.

The workers here hold leases far longer than the waits: a task left `running` shows as
a timed-out wait, never as a lease that expired and was recovered meanwhile."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cairnqd._failures import MESSAGE_MAX_CHARS, TRACEBACK_MAX_CHARS, format_traceback
from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.errors import SerializationError, TaskError, exception_text
from cairnqd.models import Task
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.store import query
from tests.support.tracing import traced
from tests.support.worker import (
    ErrorLog,
    caught_signals,
    eventually,
    reap,
    running,
    start_worker_process,
    wait_all,
    wait_exit,
    wait_status,
)

pytestmark = pytest.mark.timeout(120)

LEASE_MS = 120_000
# A failure is written as soon as the handler ends; this only bounds a wait that fails.
SETTLED_WITHIN = 10.0

# How the handler runs: awaited, or in the thread pool; alone, or under `max_run_ms`
# (which runs it in a task, or a thread, of its own).
HOW = ["async", "sync", "async-max-run", "sync-max-run"]


class StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("x")


class StrNotText(Exception):
    def __str__(self) -> Any:
        return 5


class Unprintable(Exception):
    """Everything that renders an exception fails: str, repr, its notes (a property
    that raises), and what it was raised from."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    @property
    def __notes__(self) -> Any:
        raise RuntimeError("no notes")


class BadNote:
    def __str__(self) -> str:
        raise RuntimeError("no note")


def _unprintable() -> Unprintable:
    cause = StrRaises()
    cause.__cause__ = StrNotText()
    exc = Unprintable(BadNote())
    exc.__cause__ = cause
    cause.__context__ = exc  # a cycle in the chain
    return exc


def _worker(store: TaskStore, errors: ErrorLog, **kw: Any) -> Worker:
    kw.setdefault("retry_backoff_ms", 1)
    kw.setdefault("retry_backoff_max_ms", 1)
    return Worker(store, ["default"], lease_ms=LEASE_MS, poll_interval_ms=50, on_error=errors, **kw)


async def _run_once(
    store: TaskStore,
    client: CairnQ,
    errors: ErrorLog,
    body: Callable[[TaskContext], Any],
    *,
    how: str = "async",
    status: str = "failed",
) -> Task:
    """Run a task of one attempt whose handler calls `body(ctx)`; its final row."""
    max_run_ms = 60_000 if how.endswith("max-run") else None
    worker = _worker(store, errors, max_run_ms=max_run_ms)
    if how.startswith("sync"):

        def odd(ctx: TaskContext) -> Any:
            return body(ctx)

        worker.task("odd")(odd)
    else:

        async def odd_async(ctx: TaskContext) -> Any:
            value = body(ctx)
            if hasattr(value, "__await__"):
                value = await value
            return value

        worker.task("odd")(odd_async)
    task = await client.submit("odd", max_attempts=1)
    async with running(worker):
        return await wait_status(store, task.id, status, within=SETTLED_WITHIN)


def _raise(exc: BaseException) -> Callable[[TaskContext], Any]:
    def body(ctx: TaskContext) -> Any:
        raise exc

    return body


# -- an exception that cannot be shown -------------------------------------------------


@pytest.mark.parametrize("how", HOW)
async def test_an_exception_whose_str_raises_fails_the_task(
    store: TaskStore, client: CairnQ, errors: ErrorLog, how: str
) -> None:
    done = await _run_once(store, client, errors, _raise(StrRaises()), how=how)
    assert done.error is not None
    message = "<exception str() failed: RuntimeError: x>"
    assert {k: done.error[k] for k in ("type", "code", "message", "retryable")} == {
        "type": "StrRaises",
        "code": "handler_error",
        "message": message,
        "retryable": True,
    }
    # The traceback is `traceback`'s own, with its own placeholder.
    assert "StrRaises: <exception str() failed>" in done.error["details"]["traceback"]
    assert not errors.calls, errors


async def test_an_exception_whose_str_raises_fails_the_task_when_traced(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    """The process span records the exception its own way, which calls `str()` too."""
    with traced():
        done = await _run_once(store, client, errors, _raise(StrRaises()))
    assert done.error is not None
    assert done.error["message"] == "<exception str() failed: RuntimeError: x>"
    # The span could not record it (OpenTelemetry's `record_exception` calls `str()`).
    assert [(type(e).__name__, str(e)) for e, _ in errors.calls] == [("RuntimeError", "x")]


@pytest.mark.parametrize("how", ["async", "sync"])
async def test_an_exception_whose_str_is_not_text_fails_the_task(
    store: TaskStore, client: CairnQ, errors: ErrorLog, how: str
) -> None:
    done = await _run_once(store, client, errors, _raise(StrNotText()), how=how)
    assert done.error is not None
    assert (done.error["type"], done.error["message"]) == (
        "StrNotText",
        "<exception str() failed: TypeError: __str__ returned non-string (type int)>",
    )


@pytest.mark.parametrize("how", ["async", "sync"])
async def test_an_exception_nothing_can_render_fails_the_task(
    store: TaskStore, client: CairnQ, errors: ErrorLog, how: str
) -> None:
    done = await _run_once(store, client, errors, _raise(_unprintable()), how=how)
    assert done.error is not None
    assert (done.error["type"], done.error["code"]) == ("Unprintable", "handler_error")
    assert done.error["message"] == "<exception str() failed: RuntimeError: no str>"
    stored = done.error["details"]["traceback"]
    assert "in body" in stored, "the frames are kept"
    assert "Unprintable: <exception str() failed: RuntimeError: no str>" in stored


def test_rendering_never_raises() -> None:
    exc = _unprintable()
    assert exception_text(exc) == "<exception str() failed: RuntimeError: no str>"
    assert "Unprintable" in format_traceback(exc)

    class Worse(Exception):
        def __str__(self) -> str:
            raise StrRaises()  # whose own str() fails too

    assert exception_text(Worse()) == "<exception str() failed: StrRaises>"
    many_notes = ValueError("v")
    many_notes.__notes__ = [BadNote(), "fine"]  # type: ignore[attr-defined]
    assert "fine" in format_traceback(many_notes)
    not_a_list = ValueError("v")
    not_a_list.__notes__ = 5  # type: ignore[attr-defined]
    assert "ValueError: v" in format_traceback(not_a_list)


# -- text Postgres cannot store ----------------------------------------------------------


@pytest.mark.parametrize("how", ["async", "sync"])
async def test_nul_and_surrogates_in_an_exception_are_escaped(
    store: TaskStore, client: CairnQ, errors: ErrorLog, how: str
) -> None:
    done = await _run_once(store, client, errors, _raise(ValueError("a\x00b\ud800c")), how=how)
    assert done.error is not None
    assert (done.error["type"], done.error["code"]) == ("ValueError", "handler_error")
    assert done.error["message"] == "a\\x00b\\ud800c"
    assert "ValueError: a\\x00b\\ud800c" in done.error["details"]["traceback"]
    assert not errors.calls, errors


@pytest.mark.parametrize("how", ["async", "sync"])
async def test_nul_and_surrogates_in_a_task_error_are_escaped(
    store: TaskStore, client: CairnQ, errors: ErrorLog, how: str
) -> None:
    chosen = TaskError(
        "a\x00b", code="c\ud800", type="T\x00", details={"k\x00": ["v\udc80", "\U0001f600"]}
    )
    done = await _run_once(store, client, errors, _raise(chosen), how=how)
    assert done.error == {
        "type": "T\\x00",
        "code": "c\\ud800",
        "message": "a\\x00b",
        "retryable": False,
        "details": {"k\\x00": ["v\\udc80", "\U0001f600"]},
    }
    assert not errors.calls, errors


async def test_nul_in_ctx_fail_is_escaped(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    async def body(ctx: TaskContext) -> None:
        await ctx.fail("c\x00d", retryable=False)

    done = await _run_once(store, client, errors, body)
    assert done.error is not None
    assert (done.error["type"], done.error["message"]) == ("TaskError", "c\\x00d")


async def test_ctx_fail_with_an_exception_whose_str_raises(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    """`ctx.fail(exc)` renders the exception as the runner does: never raising."""

    async def body(ctx: TaskContext) -> None:
        await ctx.fail(StrRaises(), retryable=False)

    done = await _run_once(store, client, errors, body)
    assert done.error is not None
    assert done.error["type"] == "StrRaises"
    assert done.error["message"].startswith("<exception str() failed")


async def test_nul_in_a_result_is_still_refused(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    done = await _run_once(store, client, errors, lambda ctx: "a\x00b")
    assert done.error is not None
    assert (done.error["type"], done.error["code"]) == (
        "SerializationError",
        "unserializable_result",
    )
    assert "NUL" in done.error["message"]


# A database that refuses one failure, by a trigger: the worker itself now writes every
# failure a handler can raise, so the refusal has to come from the database's side.
REFUSE_POISON = {
    "sqlite": [
        "create trigger refuse_poison before update of error on cairnq_tasks "
        "when json_extract(new.error, '$.message') = 'poison' "
        "begin select raise(abort, 'poison refused'); end"
    ],
    "postgres": [
        "create function refuse_poison() returns trigger language plpgsql as $$ begin "
        "if new.error->>'message' = 'poison' then raise exception 'poison refused'; end if; "
        "return new; end $$",
        "create trigger refuse_poison before update on cairnq_tasks for each row "
        "execute function refuse_poison()",
    ],
}


async def test_a_failure_the_database_refuses_still_lets_the_lease_go(
    store: TaskStore, client: CairnQ, errors: ErrorLog, dialect: str, db_target: str
) -> None:
    """A failure that cannot be written is reported, and the worker stops renewing its
    lease, so the task is recovered rather than `running` for ever (what
    tests/worker/test_lease.py's NUL message used to provoke, now written escaped)."""
    for sql in REFUSE_POISON[dialect]:
        query(dialect, db_target, sql)
    worker = Worker(
        store, ["default"], lease_ms=600, poll_interval_ms=50, retry_backoff_ms=0, on_error=errors
    )

    @worker.task
    async def poisoned(ctx: TaskContext) -> None:
        raise ValueError("poison")

    task = await client.submit("poisoned", max_attempts=2)
    async with running(worker):
        await eventually(lambda: errors.calls, what="the refused failure to be reported")

        async def redelivered() -> bool:
            row = await store.get(task.id)
            return row is not None and (row.attempt >= 2 or row.status != "running")

        await eventually(redelivered, within=5, what="the lease to lapse and be recovered")
    assert "poison refused" in str(errors.calls[0][0])


# -- KeyboardInterrupt and SystemExit ----------------------------------------------------

INTERRUPTS_SCRIPT = """
import sys
worker = make_worker(
    poll_interval_ms=20, lease_ms=120000, retry_backoff_ms=1, retry_backoff_max_ms=1,
    max_run_ms=MAX_RUN_MS,
)

@worker.task
def sync_interrupt(ctx):
    raise KeyboardInterrupt("sync")

@worker.task
async def async_interrupt(ctx):
    raise KeyboardInterrupt("async")

@worker.task
def sync_exit(ctx):
    sys.exit(3)

@worker.task
async def async_exit(ctx):
    sys.exit(4)

worker.serve()
mark("serve-returned")
"""

SIGTERM_BIT = 1 << (signal.SIGTERM - 1)


@pytest.mark.parametrize("max_run_ms", [None, 60_000])
async def test_a_handler_raising_keyboard_interrupt_or_system_exit_fails_its_task(
    store: TaskStore, client: CairnQ, dialect: str, db_target: str, tmp_path: Path,
    max_run_ms: int | None,
) -> None:  # fmt: skip
    names = ["sync_interrupt", "async_interrupt", "sync_exit", "async_exit"]
    tasks = [await client.submit(name, max_attempts=1) for name in names]
    flags = tmp_path / "flags"
    script = INTERRUPTS_SCRIPT.replace("MAX_RUN_MS", repr(max_run_ms))
    proc = start_worker_process(
        script, dialect=dialect, target=db_target, flags=flags, tmp=tmp_path
    )
    try:
        done = await wait_all(store, [t.id for t in tasks], "failed", within=SETTLED_WITHIN * 2)
        assert proc.poll() is None, "the worker must outlive its handlers' failures"
        proc.send_signal(signal.SIGTERM)
        code = await wait_exit(proc)
    finally:
        _, _, err = reap(proc)
    assert code == 0, err
    assert (flags / "serve-returned").exists()
    shown = [(t.error or {}).get(k) for t in done for k in ("type", "message", "retryable")]
    assert shown == [
        "KeyboardInterrupt", "sync", True,
        "KeyboardInterrupt", "async", True,
        "SystemExit", "3", True,
        "SystemExit", "4", True,
    ]  # fmt: skip


CTRL_C_SCRIPT = """
MAIN = []

@worker.task
async def spin(ctx):
    mark("started")
    if RUNNER:
        # asyncio.run's own SIGINT handler cancels the main task on the first Ctrl-C.
        while not MAIN[0].cancelling():
            await asyncio.sleep(0.01)
        mark("first-seen")
    await wait_flag("spin")
    mark("spinning")
    n = 0
    while True:  # never yields: the next Ctrl-C lands in this frame
        n += 1

async def main():
    MAIN.append(asyncio.current_task())
    await worker.run()

if RUNNER:
    asyncio.run(main())
else:
    worker.serve()
mark("returned")
"""


@pytest.mark.parametrize("runner", ["serve", "asyncio.run"])
async def test_a_real_ctrl_c_inside_an_async_handler_still_stops_the_worker(
    store: TaskStore, client: CairnQ, dialect: str, db_target: str, tmp_path: Path,
    runner: str,
) -> None:  # fmt: skip
    """The second Ctrl-C raises KeyboardInterrupt in whatever frame runs, here the
    handler's: that one is the process's, not the handler's, and it goes through."""
    task = await client.submit("spin")
    flags = tmp_path / "flags"
    script = "worker = make_worker(poll_interval_ms=20, lease_ms=120000)\n"
    script += f"RUNNER = {runner == 'asyncio.run'}\n" + CTRL_C_SCRIPT
    proc = start_worker_process(
        script, dialect=dialect, target=db_target, flags=flags, tmp=tmp_path
    )
    try:
        await eventually(lambda: (flags / "started").exists() or proc.poll() is not None)
        assert proc.poll() is None, reap(proc)
        proc.send_signal(signal.SIGINT)
        if runner == "serve":
            # serve() removes its handlers on the first signal.
            await eventually(lambda: not caught_signals(proc.pid) & SIGTERM_BIT)
        else:
            await eventually(lambda: (flags / "first-seen").exists() or proc.poll() is not None)
        (flags / "spin").touch()
        await eventually(lambda: (flags / "spinning").exists() or proc.poll() is not None)
        assert proc.poll() is None, reap(proc)
        proc.send_signal(signal.SIGINT)
        code = await wait_exit(proc)
    finally:
        _, _, err = reap(proc)
    assert code in (-signal.SIGINT, 128 + signal.SIGINT), (code, err)
    assert "KeyboardInterrupt" in err
    assert not (flags / "returned").exists()
    row = await store.get(task.id)
    assert row is not None and row.status == "running", "an interrupted task is not settled"


# -- a huge message ----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["async", "sync"])
async def test_a_huge_message_is_cut(
    store: TaskStore, client: CairnQ, errors: ErrorLog, how: str
) -> None:
    size = 5_000_000
    exc: BaseException = ValueError("m" * size) if how == "async" else TaskError("t" * size)
    done = await _run_once(store, client, errors, _raise(exc), how=how)
    assert done.error is not None
    message = done.error["message"]
    assert len(message) <= MESSAGE_MAX_CHARS + 100
    assert message.startswith(("m" if how == "async" else "t") * 100)
    assert f"cut: {size} characters" in message
    assert len(done.error["details"].get("traceback", "")) <= TRACEBACK_MAX_CHARS + 100


# -- envelopes that are not quite envelopes -----------------------------------------------


async def test_ctx_fail_with_an_empty_envelope_stores_a_whole_one(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    async def body(ctx: TaskContext) -> None:
        await ctx.fail({}, retryable=False)

    done = await _run_once(store, client, errors, body)
    assert done.error == {
        "type": "TaskError",
        "code": "task_error",
        "message": "task failed",
        "retryable": False,
        "details": {},
    }


async def test_ctx_fail_refuses_what_json_cannot_carry(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    refused: list[BaseException] = []

    async def body(ctx: TaskContext) -> str:
        for bad in ({"weird": object()}, {"message": 5}, {"details": [1]}, {"retryable": "no"}):
            try:
                await ctx.fail(bad)
            except (SerializationError, ValueError) as exc:
                refused.append(exc)
        return "still ours"

    done = await _run_once(store, client, errors, body, status="succeeded")
    assert done.result == "still ours", "a refused ctx.fail writes nothing"
    assert [type(e).__name__ for e in refused] == ["SerializationError"] + ["ValueError"] * 3
    assert "error is not JSON-serializable" in str(refused[0])
    assert "error['message'] must be a str" in str(refused[1])
    assert "error['details'] must be a mapping" in str(refused[2])
    assert "error['retryable'] must be a bool" in str(refused[3])


def test_task_error_refuses_what_it_cannot_store() -> None:
    with pytest.raises(SerializationError, match="TaskError details is not JSON-serializable"):
        TaskError("te", details={"s": {1, 2}})
    with pytest.raises(ValueError, match="TaskError message must be a str, got NoneType"):
        TaskError(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="TaskError code must be a str, got int"):
        TaskError("m", code=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="TaskError type must be a str, got object"):
        TaskError("m", type=object())  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["async", "sync"])
async def test_a_task_error_with_details_json_cannot_carry_fails_clearly(
    store: TaskStore, client: CairnQ, errors: ErrorLog, how: str
) -> None:
    def body(ctx: TaskContext) -> None:
        raise TaskError("te", details={"s": {1, 2}})

    done = await _run_once(store, client, errors, body, how=how)
    assert done.error is not None
    assert done.error["type"] == "SerializationError"
    assert "TaskError details is not JSON-serializable" in done.error["message"]


class BrokenEnvelope(TaskError):
    def envelope(self) -> dict[str, Any]:
        raise RuntimeError("no envelope")


async def test_a_task_error_whose_envelope_cannot_be_stored_fails_as_any_exception(
    store: TaskStore, client: CairnQ, errors: ErrorLog
) -> None:
    mutated = TaskError("later", retryable=False)
    mutated.details = {"s": {1, 2}}

    cases = ((BrokenEnvelope("be"), "RuntimeError: no envelope"), (mutated, "not JSON-serial"))
    for exc, why in cases:
        done = await _run_once(store, client, errors, _raise(exc))
        assert done.error is not None
        assert (done.error["type"], done.error["code"]) == (type(exc).__name__, "handler_error")
        assert done.error["message"] == str(exc)
        assert done.error["retryable"] is True
        assert why in done.error["details"]["envelope_error"]
        assert "traceback" in done.error["details"]
