"""Logs inside a handler name their task (cairnqd/tasklog.py): any logger, async and
sync handlers, `ctx.logger` from a thread the handler started; in the daemon's json
and text formats, with the trace and span ids when tracing is on."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from cairnqd.context import TaskContext
from cairnqd.daemon.logs import JsonFormatter, TextFormatter
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.tracing import ids, named, traced
from tests.support.worker import SQLITE_ONLY, eventually, running, wait_status

pytestmark = pytest.mark.timeout(60)

app_log = logging.getLogger("tests.app")


@pytest.fixture
def outputs() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """What `tests.app` and `cairnqd.task.*` log, in json and in text."""
    as_json, as_text = io.StringIO(), io.StringIO()
    handlers = [logging.StreamHandler(as_json), logging.StreamHandler(as_text)]
    handlers[0].setFormatter(JsonFormatter("[test] 1/1"))
    handlers[1].setFormatter(TextFormatter("[test] 1/1"))
    loggers = [app_log, logging.getLogger("cairnqd.task")]
    for logger in loggers:
        logger.setLevel(logging.INFO)
        for handler in handlers:
            logger.addHandler(handler)
    try:
        yield as_json, as_text
    finally:
        for logger in loggers:
            logger.setLevel(logging.NOTSET)
            for handler in handlers:
                logger.removeHandler(handler)


def register(worker: Worker) -> None:
    @worker.task
    async def greet(ctx: TaskContext, payload: Any) -> None:
        app_log.info("async says %s", payload, extra={"marker": "a"})

    @worker.task
    def crunch(ctx: TaskContext, payload: Any) -> None:
        app_log.info("sync says %s", payload)

        def elsewhere() -> None:
            ctx.logger.info("thread says %s", payload)
            app_log.info("untagged from a bare thread")

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()


@SQLITE_ONLY
async def test_records_inside_handlers_carry_the_task(
    store: TaskStore, outputs: tuple[io.StringIO, io.StringIO]
) -> None:
    as_json, as_text = outputs
    worker = Worker(store, ["default"], poll_interval_ms=20)
    register(worker)
    first = await store.submit(name="greet", payload="hi")
    second = await store.submit(name="crunch", payload="ho")
    async with running(worker):
        await wait_status(store, first.id, "succeeded")
        await wait_status(store, second.id, "succeeded")
    app_log.info("after the worker")
    lines = [json.loads(line) for line in as_json.getvalue().splitlines()]
    by_message = {e["message"]: e for e in lines}
    greeted = by_message["async says hi"]
    assert (greeted["task_id"], greeted["task_name"], greeted["queue"], greeted["attempt"]) == (
        first.id, "greet", "default", 1,
    )  # fmt: skip
    assert greeted["marker"] == "a"
    assert "trace_id" not in greeted  # no provider: no trace
    assert not any(key.startswith("cairnq_") for key in greeted)
    for message in ("sync says ho", "thread says ho"):
        assert by_message[message]["task_id"] == second.id
        assert by_message[message]["task_name"] == "crunch"
    # ctx.logger is named after the task, and the record names the caller's line.
    assert by_message["thread says ho"]["logger"] == "cairnqd.task.crunch"
    assert "task_id" not in by_message["untagged from a bare thread"]
    assert "task_id" not in by_message["after the worker"]

    text = as_text.getvalue().splitlines()
    [greet_line] = [line for line in text if line.endswith("async says hi")]
    assert f" tests.app [task {first.id} greet#1 @default] async says hi" in greet_line
    [bare] = [line for line in text if line.endswith("untagged from a bare thread")]
    assert "[task" not in bare


@SQLITE_ONLY
async def test_traced_records_carry_the_trace_and_span_ids(
    store: TaskStore, outputs: tuple[io.StringIO, io.StringIO]
) -> None:
    as_json, as_text = outputs
    with traced() as exporter:
        worker = Worker(store, ["default"], poll_interval_ms=20)
        register(worker)
        task = await store.submit(name="greet", payload="traced")
        async with running(worker):
            await wait_status(store, task.id, "succeeded")
            await eventually(lambda: named(exporter.get_finished_spans(), "process default"))
        [span] = named(exporter.get_finished_spans(), "process default")
    [entry] = [json.loads(line) for line in as_json.getvalue().splitlines()]
    assert (entry["trace_id"], entry["span_id"]) == ids(span)
    assert entry["task_id"] == task.id
    assert f"trace={ids(span)[0]}]" in as_text.getvalue()


def test_ctx_logger_records_name_the_calling_line(
    outputs: tuple[io.StringIO, io.StringIO],
) -> None:
    from cairnqd.tasklog import TaskLogger

    class FakeTask:
        id, name, queue, attempt = "t1", "n", "q", 2

    class FakeContext:
        task = FakeTask()
        trace_span = None

    adapter = TaskLogger(logging.getLogger("tests.app"), FakeContext())  # type: ignore[arg-type]
    records: list[logging.LogRecord] = []
    capture = logging.Handler()
    capture.emit = records.append  # type: ignore[method-assign]
    app_log.addHandler(capture)
    try:
        adapter.warning("here")
    finally:
        app_log.removeHandler(capture)
    [record] = records
    assert record.funcName == "test_ctx_logger_records_name_the_calling_line"
    assert record.cairnq_task_id == "t1" and record.cairnq_attempt == 2  # type: ignore[attr-defined]
