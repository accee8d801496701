"""A daemon with `tracing.enabled` exports its process spans over OTLP/HTTP (protobuf),
configured by the standard `OTEL_*` variables alone, to a collector: here a receiver the
test runs (tests/support/otlp.py). The spans continue the trace of the submit made in
this process, carry the messaging attributes and the child's resource, and reach the
collector when a drain stops the daemon, though the batch would not have sent them on
its own for a minute. A task a public-SDK application submits starts a trace of its
own, unless the application wrote a W3C `traceparent` into its metadata itself. A
collector that never answers holds neither a drain nor a QUIT past the child's bounds
for its flush.

The children load `registry` from this module.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from cairnqd import CairnQ
from cairnqd.models import Task
from cairnqd.registry import TaskRegistry
from tests.support.daemon import Daemon, base_config, gone
from tests.support.databases import make_store
from tests.support.otlp import Blackhole, ReceivedSpan, Receiver
from tests.support.store import upstream_client
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


def otlp_env(receiver: Receiver | Blackhole, **more: str) -> dict[str, str]:
    """The daemon's environment for exporting to `receiver`: the standard variables,
    which the SDK reads as the otlp_proto_http exporter posting to ENDPOINT/v1/traces."""
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": "billing",
        **more,
    }


def traced_config(tmp_path: Path, dialect: str, target: str) -> dict[str, Any]:
    config = base_config(
        tmp_path,
        database_config(dialect, target),
        {"default": {"queues": ["q"], "processes": 1, "concurrency": 1}},
    )
    config["handlers"] = ["tests.daemon.test_tracing_otlp:registry"]
    config["tracing"] = {"enabled": True}
    return config


def test_process_spans_reach_an_otlp_http_collector_on_drain(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Callable[..., Daemon]
) -> None:
    config = traced_config(tmp_path, dialect, db_target)
    with Receiver() as receiver:
        # Nothing leaves on the batch's own schedule within the test: only the flush of
        # the drain exports.
        env = otlp_env(receiver, OTEL_BSP_SCHEDULE_DELAY="60000")
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


def test_a_public_sdk_task_starts_its_own_trace_unless_its_metadata_names_one(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Callable[..., Daemon]
) -> None:
    config = traced_config(tmp_path, dialect, db_target)
    # The application's own trace, as its tracer would have written it.
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    traceparent = f"00-{trace_id}-{parent_id}-01"

    async def submit_both() -> tuple[Any, Any]:
        async with upstream_client(dialect, db_target, max_size=2) as theirs:
            plain = await theirs.submit("otlp.work", {"n": 1}, queue="q")
            carried = await theirs.submit(
                "otlp.work", {"n": 2}, queue="q", metadata={"traceparent": traceparent}
            )
            return plain, carried

    with Receiver() as receiver:
        # Exported on the batch's own schedule, while the daemon runs.
        daemon = daemon_factory(config).start(env=otlp_env(receiver, OTEL_BSP_SCHEDULE_DELAY="50"))
        plain, carried = asyncio.run(submit_both())
        spans = wait_for(
            "both process spans at the collector, the daemon running",
            lambda: {s.attributes["messaging.message.id"]: s for s in receiver.spans()},
            accept=lambda found: {plain.id, carried.id} <= set(found),
        )
        assert daemon.stop() == 0, daemon.output()
        assert receiver.refused == []

    own, continued = spans[plain.id], spans[carried.id]
    for span in (own, continued):
        assert (span.name, span.kind) == ("process q", "SPAN_KIND_CONSUMER")
        assert span.attributes["cairnq.task.outcome"] == "succeeded"
    assert own.parent_span_id is None and own.links == []
    assert own.trace_id != trace_id
    assert (continued.trace_id, continued.parent_span_id) == (trace_id, parent_id)
    assert continued.links == [(trace_id, parent_id)]


@pytest.mark.timing
def test_a_collector_that_never_answers_holds_up_neither_quit_nor_drain(
    tmp_path: Path, daemon_factory: Callable[..., Daemon]
) -> None:
    """The exporter would wait a minute per request; the child gives its flush 1 s on
    QUIT and 5 s on a drain, then exits, well before the parent's shutdown_timeout
    would have to stop it."""
    db = str(tmp_path / "tasks.db")
    config = traced_config(tmp_path, "sqlite", db)
    config["shutdown_timeout"] = "40s"
    with Blackhole() as collector:
        env = otlp_env(collector, OTEL_BSP_SCHEDULE_DELAY="60000", OTEL_EXPORTER_OTLP_TIMEOUT="60")
        daemon = daemon_factory(config).start(env=env)
        first, _ = submit_traced("sqlite", db, "otlp.work", 1)
        wait_status("sqlite", db, first.id, "succeeded")
        [child] = daemon.children()
        os.kill(child, signal.SIGQUIT)
        wait_for("the child gone after QUIT", lambda: gone(child), timeout=20)
        wait_for("a new child", lambda: set(daemon.children()) - {child})
        second, _ = submit_traced("sqlite", db, "otlp.work", 2)
        wait_status("sqlite", db, second.id, "succeeded")
        daemon.signal(signal.SIGTERM)
        wait_for("the daemon drained", lambda: gone(daemon.pid), timeout=25)
    assert daemon.stop() == 0, daemon.output()
    log = daemon.output()
    assert "still draining at its shutdown_timeout" not in log
    assert log.count("tracing: spans not exported within 1s of exiting") == 1, log
    assert log.count("tracing: spans not exported within 5s of exiting") == 1, log


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
