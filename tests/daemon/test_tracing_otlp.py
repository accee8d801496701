"""A daemon with `tracing.enabled` exports its process spans over OTLP/HTTP (protobuf),
configured by the standard `OTEL_*` variables alone, to a collector: here a receiver the
test runs (tests/support/otlp.py). The spans continue the trace of the submit made in
this process, carry the messaging attributes and the child's resource, and reach the
collector when a drain stops the daemon, though the batch would not have sent them on
its own for a minute.

The children load `registry` from this module.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from cairnqd import CairnQ
from cairnqd.models import Task
from cairnqd.registry import TaskRegistry
from tests.support.daemon import Daemon, base_config
from tests.support.databases import make_store
from tests.support.otlp import ReceivedSpan, Receiver
from tests.support.tracing import ids, one, traced
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

registry = TaskRegistry()


@registry.task("otlp.work")
async def work(ctx: Any, payload: Any) -> Any:
    return payload


@registry.task("otlp.fail")
async def fail(ctx: Any, payload: Any) -> None:
    raise ValueError(f"refused {payload['n']}")


def database_config(dialect: str, target: str) -> dict[str, Any]:
    return {"path": target} if dialect == "sqlite" else {"dsn": target, "auto_migrate": True}


async def _with_client(dialect: str, target: str, call: Any) -> Any:
    client = CairnQ(make_store(dialect, target))
    await client.connect()
    try:
        return await call(client)
    finally:
        await client.close()


def submit_traced(dialect: str, target: str, name: str, n: int) -> tuple[Task, tuple[str, str]]:
    """Submit from this process inside a span: the task and its create span's ids."""

    async def go(client: CairnQ) -> Task:
        with trace.get_tracer("test").start_as_current_span("request"):
            return await client.submit(name, {"n": n}, queue="q", max_attempts=1)

    with traced() as exporter:
        task = asyncio.run(_with_client(dialect, target, go))
        create = one(exporter.get_finished_spans(), "create q")
    return task, ids(create)


def status_of(dialect: str, target: str, task_id: str) -> str | None:
    async def go(client: CairnQ) -> str | None:
        found = await client.get(task_id)
        return None if found is None else found.status

    result: str | None = asyncio.run(_with_client(dialect, target, go))
    return result


def wait_status(dialect: str, target: str, task_id: str, status: str) -> None:
    wait_for(f"{task_id} to be {status}", lambda: status_of(dialect, target, task_id) == status)


def test_process_spans_reach_an_otlp_http_collector_on_drain(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Callable[..., Daemon]
) -> None:
    config = base_config(
        tmp_path,
        database_config(dialect, db_target),
        {"default": {"queues": ["q"], "processes": 1, "concurrency": 1}},
    )
    config["handlers"] = ["tests.daemon.test_tracing_otlp:registry"]
    config["tracing"] = {"enabled": True}
    with Receiver() as receiver:
        env = {
            # The SDK's own reading of these: `otlp` over http/protobuf is the
            # otlp_proto_http exporter, which posts to ENDPOINT + /v1/traces.
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_SERVICE_NAME": "billing",
            # Nothing leaves on the batch's own schedule within the test: only the
            # flush of the drain exports.
            "OTEL_BSP_SCHEDULE_DELAY": "60000",
        }
        daemon = daemon_factory(config).start(env=env)
        try:
            done, done_create = submit_traced(dialect, db_target, "otlp.work", 1)
            failed, failed_create = submit_traced(dialect, db_target, "otlp.fail", 2)
            wait_status(dialect, db_target, done.id, "succeeded")
            wait_status(dialect, db_target, failed.id, "failed")
            assert receiver.spans() == [], "exported before the drain's flush"
        finally:
            code = daemon.stop()
        assert code == 0, daemon.output()
        spans = wait_for(
            "both process spans at the collector",
            lambda: {s.attributes["messaging.message.id"]: s for s in receiver.spans()},
            accept=lambda found: {done.id, failed.id} <= set(found),
        )
        assert receiver.refused == []

    assert len(spans) == 2, [s.name for s in spans.values()]
    for task, create in ((done, done_create), (failed, failed_create)):
        span = spans[task.id]
        assert_process_span(span, task, create)
    assert spans[done.id].attributes["cairnq.task.outcome"] == "succeeded"
    assert spans[done.id].status_code == "STATUS_CODE_UNSET"
    assert spans[failed.id].attributes["cairnq.task.outcome"] == "failed"
    assert spans[failed.id].status_code == "STATUS_CODE_ERROR"
    assert spans[failed.id].status_message == "ValueError: refused 2"


def assert_process_span(span: ReceivedSpan, task: Task, create: tuple[str, str]) -> None:
    """`span` is `task`'s process span, continuing the trace of its `create` span."""
    trace_id, create_id = create
    assert span.name == "process q"
    assert span.kind == "SPAN_KIND_CONSUMER"
    assert span.trace_id == trace_id
    assert span.parent_span_id == create_id
    assert span.links == [(trace_id, create_id)]
    assert span.scope == "cairnqd"
    attributes = span.attributes
    assert {k: attributes[k] for k in MESSAGING} == {
        "messaging.system": "cairnq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "q",
        "messaging.message.id": task.id,
        "cairnq.task.name": task.name,
        "cairnq.task.attempt": 1,
    }
    resource = span.resource
    assert resource["service.name"] == "billing"
    assert (resource["cairnqd.group"], resource["cairnqd.slot"]) == ("default", 1)
    # The child's worker id names its host, group and slot; the span says the same.
    assert resource["service.instance.id"].startswith(f"{socket.gethostname()}:default.0:")
    assert attributes["messaging.client.id"] == resource["service.instance.id"]
    assert resource["telemetry.sdk.language"] == "python"


MESSAGING = (
    "messaging.system",
    "messaging.operation.type",
    "messaging.operation.name",
    "messaging.destination.name",
    "messaging.message.id",
    "cairnq.task.name",
    "cairnq.task.attempt",
)
