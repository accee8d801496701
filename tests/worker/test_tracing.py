"""Traces of tasks (cairnqd/tracing.py) with the real OpenTelemetry SDK: a submit inside
a span records `create <queue>` and carries its context in the metadata; the worker's
`process <queue>` span continues it, one per attempt; nothing without a provider."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import cairnq
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, StatusCode

from cairnqd.client import CairnQ
from cairnqd.context import TaskContext
from cairnqd.store.base import TaskStore
from cairnqd.worker import Worker
from tests.support.store import upstream_client
from tests.support.tracing import attrs, ids, named, one, parent_id, traced
from tests.support.worker import (
    REPO,
    child_env,
    eventually,
    reap,
    running,
    start_worker_process,
    wait_status,
)

pytestmark = pytest.mark.timeout(60)


async def test_a_trace_runs_from_submit_to_process_and_child_tasks(
    store: TaskStore, client: CairnQ
) -> None:
    with traced() as exporter:
        worker = Worker(store, ["mail"], poll_interval_ms=20)
        children: list[str] = []

        @worker.task
        async def send(ctx: TaskContext, payload: Any) -> str:
            child = await ctx.submit("audit", {"of": ctx.task_id}, queue="mail")
            children.append(child.id)
            return "sent"

        @worker.task
        async def audit(ctx: TaskContext, payload: Any) -> None:
            return None

        with trace.get_tracer("test").start_as_current_span("request") as request:
            task = await client.submit("send", {"to": "a"}, queue="mail", metadata={"k": 1})
        assert task.metadata["k"] == 1
        traceparent = task.metadata["traceparent"]
        async with running(worker):
            await wait_status(store, task.id, "succeeded")
            await eventually(lambda: len(children) == 1)
            await wait_status(store, children[0], "succeeded")
            await eventually(lambda: len(named(exporter.get_finished_spans(), "process mail")) == 2)
        spans = exporter.get_finished_spans()

    trace_id = format(request.get_span_context().trace_id, "032x")
    creates = named(spans, "create mail")
    processes = named(spans, "process mail")
    assert len(creates) == 2 and len(processes) == 2
    create = next(s for s in creates if attrs(s)["cairnq.task.name"] == "send")
    process = next(s for s in processes if attrs(s)["cairnq.task.name"] == "send")
    # The stored context is the create span's, in the W3C form any SDK reads.
    assert traceparent.startswith(f"00-{trace_id}-{ids(create)[1]}-")
    assert create.kind is SpanKind.PRODUCER
    assert parent_id(create) == format(request.get_span_context().span_id, "016x")
    assert attrs(create) == {
        "messaging.system": "cairnq",
        "messaging.operation.type": "create",
        "messaging.operation.name": "create",
        "messaging.destination.name": "mail",
        "cairnq.task.name": "send",
        "messaging.message.id": task.id,
    }
    assert process.kind is SpanKind.CONSUMER
    assert ids(process)[0] == trace_id
    assert parent_id(process) == ids(create)[1]
    assert [format(link.context.span_id, "016x") for link in process.links] == [ids(create)[1]]
    got = attrs(process)
    assert got["messaging.operation.type"] == "process"
    assert got["messaging.message.id"] == task.id
    assert got["messaging.destination.name"] == "mail"
    assert (got["cairnq.task.name"], got["cairnq.task.attempt"]) == ("send", 1)
    assert got["cairnq.task.outcome"] == "succeeded"
    assert process.status.status_code is StatusCode.UNSET
    # ctx.submit inside the handler: its create span is a child of the process span.
    child_create = next(s for s in creates if attrs(s)["cairnq.task.name"] == "audit")
    assert parent_id(child_create) == ids(process)[1]
    child_process = next(s for s in processes if attrs(s)["cairnq.task.name"] == "audit")
    assert parent_id(child_process) == ids(child_create)[1]
    assert {ids(s)[0] for s in spans} == {trace_id}


async def test_a_failure_and_its_retry_are_two_spans_of_one_trace(store: TaskStore) -> None:
    with traced() as exporter:
        worker = Worker(store, ["default"], poll_interval_ms=20, retry_backoff_ms=1)

        @worker.task
        async def flaky(ctx: TaskContext, payload: Any) -> str:
            if ctx.attempt == 1:
                raise RuntimeError("first attempt breaks")
            return "ok"

        with trace.get_tracer("test").start_as_current_span("request"):
            task = await CairnQ(store).submit("flaky", max_attempts=3)
        async with running(worker):
            done = await wait_status(store, task.id, "succeeded")
            await eventually(
                lambda: len(named(exporter.get_finished_spans(), "process default")) == 2
            )
        spans = exporter.get_finished_spans()

    assert done.attempt == 2
    create = one(spans, "create default")
    first, second = sorted(
        named(spans, "process default"), key=lambda s: attrs(s)["cairnq.task.attempt"]
    )
    assert [attrs(s)["cairnq.task.attempt"] for s in (first, second)] == [1, 2]
    for span in (first, second):
        assert ids(span)[0] == ids(create)[0]
        assert parent_id(span) == ids(create)[1]
        assert [format(link.context.span_id, "016x") for link in span.links] == [ids(create)[1]]
    assert ids(first)[1] != ids(second)[1]
    assert first.status.status_code is StatusCode.ERROR
    assert "first attempt breaks" in (first.status.description or "")
    [event] = [e for e in first.events if e.name == "exception"]
    assert dict(event.attributes or {})["exception.type"] == "RuntimeError"
    assert attrs(first)["cairnq.task.outcome"] == "retried"
    assert attrs(second)["cairnq.task.outcome"] == "succeeded"
    assert second.status.status_code is StatusCode.UNSET


async def test_a_final_failure_through_ctx_fail_ends_in_error(store: TaskStore) -> None:
    with traced() as exporter:
        worker = Worker(store, ["default"], poll_interval_ms=20)

        @worker.task
        async def refuse(ctx: TaskContext, payload: Any) -> None:
            await ctx.fail("not today", retryable=False)

        task = await CairnQ(store).submit("refuse")
        async with running(worker):
            await wait_status(store, task.id, "failed")
            await eventually(lambda: named(exporter.get_finished_spans(), "process default"))
        [process] = named(exporter.get_finished_spans(), "process default")
    assert process.status.status_code is StatusCode.ERROR
    assert attrs(process)["cairnq.task.outcome"] == "failed"
    # Submitted outside any span: no create span, and the worker starts a new trace.
    assert not named(exporter.get_finished_spans(), "create default")
    assert process.parent is None and not process.links


async def test_submit_keeps_what_the_caller_set(store: TaskStore, client: CairnQ) -> None:
    theirs = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with traced() as exporter:
        with trace.get_tracer("test").start_as_current_span("request"):
            kept = await client.submit("a", metadata={"traceparent": theirs})
            listed = await client.submit("a", metadata=["not", "an", "object"])
            many = await client.submit_many(
                [{"name": "b", "queue": "q1"}, {"name": "c", "queue": "q2", "metadata": {"x": 1}}]
            )
        spans = exporter.get_finished_spans()
    assert kept.metadata == {"traceparent": theirs}
    assert listed.metadata == ["not", "an", "object"]
    assert set(many[0].metadata) == {"traceparent"}
    assert many[1].metadata["x"] == 1 and "traceparent" in many[1].metadata
    q1, q2 = one(spans, "create q1"), one(spans, "create q2")
    assert attrs(q1)["messaging.message.id"] == many[0].id
    assert attrs(q2)["messaging.message.id"] == many[1].id
    assert many[1].metadata["traceparent"].split("-")[2] == ids(q2)[1]
    stored = await client.get(many[0].id)
    assert stored is not None and stored.metadata == many[0].metadata
    # Without an active span a submit records nothing and writes no key.
    with traced() as exporter:
        plain = await client.submit("a")
    assert plain.metadata == {} and not exporter.get_finished_spans()


def test_without_a_provider_nothing_is_imported_or_written(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import asyncio, json, sys
        from cairnqd import CairnQ, Worker

        async def main():
            path = sys.argv[1]
            client = CairnQ.sqlite(path)
            await client.connect()
            worker = Worker(client.store, ["default"], poll_interval_ms=20)
            seen = []

            @worker.task
            async def work(ctx, payload):
                seen.append(await ctx.submit("child"))

            task = await client.submit("work")
            async with worker.background():
                while (await client.get(task.id)).status != "succeeded":
                    await asyncio.sleep(0.02)
            print(json.dumps({
                "metadata": [task.metadata, seen[0].metadata],
                "loaded": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
            }))
            await client.close()

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "q.db")],
        capture_output=True, text=True, env=child_env(), cwd=str(REPO), timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report == {"metadata": [{}, {}], "loaded": []}


async def test_a_worker_in_another_process_continues_the_trace(
    store: TaskStore, client: CairnQ, dialect: str, db_target: str, tmp_path: Path
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    worker = start_worker_process(
        f"""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace import export

        class ToFile(export.SpanExporter):
            def export(self, spans):
                with open({str(spans_file)!r}, "a") as out:
                    for s in spans:
                        c, p = s.get_span_context(), s.parent
                        out.write(json.dumps({{
                            "name": s.name, "trace": format(c.trace_id, "032x"),
                            "parent": None if p is None else format(p.span_id, "016x"),
                            "attributes": dict(s.attributes),
                        }}) + "\\n")
                return export.SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(export.SimpleSpanProcessor(ToFile()))
        trace.set_tracer_provider(provider)

        async def main():
            worker = make_worker(queues=["default"], poll_interval_ms=20)

            @worker.task
            async def work(ctx, payload):
                return payload

            async with worker.background():
                await wait_flag("stop")
            await worker.close()

        asyncio.run(main())
        """,
        dialect=dialect, target=db_target, flags=tmp_path / "flags", tmp=tmp_path,
    )  # fmt: skip
    try:
        with traced() as exporter:
            with trace.get_tracer("test").start_as_current_span("request"):
                task = await client.submit("work", 7)
            await wait_status(store, task.id, "succeeded")
            create = one(exporter.get_finished_spans(), "create default")
        await eventually(lambda: spans_file.exists() and spans_file.read_text().strip())
    finally:
        (tmp_path / "flags" / "stop").write_text("")
        code, _, err = reap(worker, timeout=30)
    assert code == 0, err
    [process] = [json.loads(line) for line in spans_file.read_text().splitlines()]
    assert process["name"] == "process default"
    assert (process["trace"], process["parent"]) == ids(create)
    assert process["attributes"]["messaging.message.id"] == task.id
    assert process["attributes"]["cairnq.task.attempt"] == 1


@pytest.fixture
async def theirs(store: TaskStore, dialect: str, db_target: str) -> AsyncIterator[Any]:
    """A public-SDK handle on the same database (after ours has migrated it)."""
    async with upstream_client(dialect, db_target) as client:
        yield client


async def test_the_public_sdk_ignores_the_keys_and_its_tasks_start_a_trace(
    store: TaskStore, client: CairnQ, theirs: Any
) -> None:
    their_worker = cairnq.Worker(theirs.store, ["theirs"], poll_interval_ms=20)

    @their_worker.task("theirs.echo")
    async def echo(ctx: Any, payload: Any) -> Any:
        return {"payload": payload, "metadata": ctx.metadata}

    with traced() as exporter:
        worker = Worker(store, ["default"], poll_interval_ms=20)

        @worker.task("ours.echo")
        async def ours(ctx: TaskContext, payload: Any) -> Any:
            return payload

        with trace.get_tracer("test").start_as_current_span("request"):
            for_them = await client.submit("theirs.echo", 1, queue="theirs")
            # Their submit inside our span: their SDK writes no context.
            from_them = await theirs.submit("ours.echo", 2)
        async with running(worker), their_worker.background():
            done_there = await wait_status(store, for_them.id, "succeeded")
            await wait_status(store, from_them.id, "succeeded")
            await eventually(lambda: named(exporter.get_finished_spans(), "process default"))
        spans = exporter.get_finished_spans()
    # Their worker ran our task, the context left as it was in the metadata.
    assert done_there.result["payload"] == 1
    assert done_there.result["metadata"]["traceparent"] == for_them.metadata["traceparent"]
    [process] = named(spans, "process default")
    assert attrs(process)["messaging.message.id"] == from_them.id
    assert process.parent is None and not process.links
    request = one(spans, "request")
    assert ids(process)[0] != ids(request)[0]


async def test_the_api_without_a_provider_records_and_writes_nothing(
    store: TaskStore, client: CairnQ
) -> None:
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)
    worker = Worker(store, ["default"], poll_interval_ms=20)
    seen: list[Any] = []

    @worker.task
    async def work(ctx: TaskContext, payload: Any) -> None:
        seen.append(ctx.trace_span)

    # The API alone hands out non-recording spans with no context to carry.
    with trace.get_tracer("test").start_as_current_span("request"):
        task = await client.submit("work")
    assert task.metadata == {}
    async with running(worker):
        await wait_status(store, task.id, "succeeded")
    assert seen == [None]
