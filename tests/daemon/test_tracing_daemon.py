"""A daemon child with `tracing.enabled` sets up the OpenTelemetry SDK from `OTEL_*`,
continues a trace started in an API process, flushes its spans on QUIT and on drain,
and its json log lines carry the ids that join them to the spans.

The children load `registry` from this module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from cairnqd import CairnQ
from cairnqd.models import Task
from cairnqd.registry import TaskRegistry
from tests.support.cli import cli
from tests.support.daemon import Daemon, base_config, write_config
from tests.support.databases import make_store
from tests.support.tracing import ids, one, traced
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

registry = TaskRegistry()
handler_log = logging.getLogger("tests.daemon.tracing")


@registry.task("trace.work")
async def work(ctx: Any, payload: Any) -> Any:
    handler_log.info("working on %s", payload["n"])
    return payload


@registry.task("trace.block")
async def block(ctx: Any, payload: Any) -> None:
    """Runs until the file named in the payload exists (the test's release)."""
    while not os.path.exists(payload["until"]):  # noqa: ASYNC110 - another process makes it
        await asyncio.sleep(0.02)


def console_spans(text: str) -> list[dict[str, Any]]:
    """The spans the SDK's console exporter printed (indented JSON objects) in `text`."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := text.find("{\n", at)) != -1:
        try:
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            at += 1
            continue
        if isinstance(value, dict) and "context" in value:
            found.append(value)
        at = end
    return found


def submit_traced(db: str, n: int) -> tuple[Task, tuple[str, str]]:
    """Submit from this process inside a span; the task and its create span's ids."""

    async def go() -> Task:
        client = CairnQ(make_store("sqlite", db))
        await client.connect()
        try:
            with trace.get_tracer("test").start_as_current_span("request"):
                return await client.submit("trace.work", {"n": n}, queue="q")
        finally:
            await client.close()

    with traced() as exporter:
        task = asyncio.run(go())
        create = one(exporter.get_finished_spans(), "create q")
    return task, ids(create)


def submit_plain(db: str, name: str, payload: Any) -> Task:
    async def go() -> Task:
        client = CairnQ(make_store("sqlite", db))
        await client.connect()
        try:
            return await client.submit(name, payload, queue="q")
        finally:
            await client.close()

    return asyncio.run(go())


def status_of(db: str, task_id: str) -> str | None:
    async def status() -> str | None:
        client = CairnQ(make_store("sqlite", db))
        await client.connect()
        try:
            found = await client.get(task_id)
            return None if found is None else found.status
        finally:
            await client.close()

    return asyncio.run(status())


def wait_succeeded(db: str, task_id: str) -> None:
    wait_for(f"{task_id} to succeed", lambda: status_of(db, task_id) == "succeeded")


def test_a_traced_child_exports_on_quit_and_on_drain(tmp_path: Path) -> None:
    db = str(tmp_path / "tasks.db")
    logs = tmp_path / "cairnqd.log"
    config = base_config(
        tmp_path, {"path": db}, {"default": {"queues": ["q"], "processes": 1, "concurrency": 1}}
    )
    config["handlers"] = ["tests.daemon.test_tracing_daemon:registry"]
    config["logging"] = {"format": "json", "file": str(logs)}
    config["tracing"] = {"enabled": True}
    env = {
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_SERVICE_NAME": "billing",
        # Nothing is exported on its own for a minute: only the flushes export.
        "OTEL_BSP_SCHEDULE_DELAY": "60000",
    }
    daemon = Daemon(tmp_path, config).start(env=env)
    try:
        [child] = daemon.children()
        first, first_create = submit_traced(db, 1)
        wait_succeeded(db, first.id)

        def printed() -> list[dict[str, Any]]:
            return [s for s in console_spans(daemon.output()) if s["name"] == "process q"]

        release = tmp_path / "release"
        blocked = submit_plain(db, "trace.block", {"until": str(release)})
        wait_for(f"{blocked.id} to run", lambda: status_of(db, blocked.id) == "running")
        assert not printed()
        os.kill(child, signal.SIGQUIT)
        wait_for("the spans flushed on QUIT", lambda: len(printed()) == 2)
        wait_for("a new child", lambda: set(daemon.children()) - {child})
        release.write_text("")
        second, second_create = submit_traced(db, 2)
        wait_succeeded(db, second.id)
    finally:
        code = daemon.stop()
    assert code == 0, daemon.output()
    spans = {
        s["attributes"]["messaging.message.id"]: s
        for s in printed()
        if s["attributes"]["cairnq.task.name"] == "trace.work"
    }
    interrupted, rerun = [
        s for s in printed() if s["attributes"]["messaging.message.id"] == blocked.id
    ]
    # Cut short by QUIT: ended in error, then run again by the new child (the attempt
    # given back), as a new trace (submitted outside any span).
    assert interrupted["attributes"]["cairnq.task.outcome"] == "interrupted"
    assert interrupted["status"]["status_code"] == "ERROR"
    assert rerun["attributes"]["cairnq.task.outcome"] == "succeeded"
    assert rerun["context"]["trace_id"] != interrupted["context"]["trace_id"]
    for task, create in ((first, first_create), (second, second_create)):
        span = spans[task.id]
        assert span["context"]["trace_id"] == f"0x{create[0]}"
        assert span["parent_id"] == f"0x{create[1]}"
        assert span["kind"] == "SpanKind.CONSUMER"
        assert span["attributes"]["cairnq.task.name"] == "trace.work"
        resource = span["resource"]["attributes"]
        assert resource["service.name"] == "billing"
        assert (resource["cairnqd.group"], resource["cairnqd.slot"]) == ("default", 1)
    lines = [json.loads(line) for line in logs.read_text().splitlines()]
    worked = {e["task_id"]: e for e in lines if e["logger"] == "tests.daemon.tracing"}
    for task in (first, second):
        entry = worked[task.id]
        span = spans[task.id]
        assert (entry["task_name"], entry["queue"], entry["attempt"]) == ("trace.work", "q", 1)
        assert f"0x{entry['trace_id']}" == span["context"]["trace_id"]
        assert f"0x{entry['span_id']}" == span["context"]["span_id"]


def test_check_names_a_missing_exporter_at_the_tracing_line(tmp_path: Path) -> None:
    config = base_config(tmp_path, {"path": str(tmp_path / "t.db")}, {"default": {"queues": ["q"]}})
    config["handlers"] = ["tests.daemon.test_tracing_daemon:registry"]
    config["tracing"] = {"enabled": True}
    path = write_config(tmp_path, config)
    done = cli(path, "check", timeout=60)
    assert done.returncode != 0
    # The line of `enabled` in the file as written: `tracing:` is the last section.
    line = path.read_text().splitlines().index("  enabled: true") + 1
    assert (
        f"{path}:{line}:12: tracing.enabled: OTEL_TRACES_EXPORTER=otlp has no exporter "
        "installed: pip install opentelemetry-exporter-otlp"
    ) in done.stdout + done.stderr
