"""The real daemon's logging: parent and children write JSON lines to one file, and
SIGUSR1 after a logrotate-style rename makes all of them switch to a fresh file.

The children load `registry` from this module, so the task below logs from a child.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from cairnqd.registry import TaskRegistry
from tests.support.daemon import Daemon, base_config
from tests.support.databases import make_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

registry = TaskRegistry()
handler_log = logging.getLogger("tests.daemon.logging")


@registry.task("log.say")
async def say(ctx: Any, payload: Any) -> None:
    handler_log.info("handled %s", payload["marker"], extra={"marker": payload["marker"]})
    handler_log.debug("debug %s", payload["marker"], extra={"marker": payload["marker"]})


def entries(path: Path) -> list[dict[str, Any]]:
    """Every line of `path`, each of which must be one JSON object."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def submit(db: str, marker: str) -> None:
    async def go() -> None:
        client = CairnQ(make_store("sqlite", db))
        await client.connect()
        try:
            await client.submit("log.say", {"marker": marker}, queue="q")
        finally:
            await client.close()

    asyncio.run(go())


def test_json_file_from_parent_and_children_and_reopen_on_sigusr1(tmp_path: Path) -> None:
    db = str(tmp_path / "tasks.db")
    path = tmp_path / "cairnqd.log"
    rotated = tmp_path / "cairnqd.log.1"
    config = base_config(
        tmp_path, {"path": db}, {"default": {"queues": ["q"], "processes": 2, "concurrency": 1}}
    )
    config["handlers"] = ["tests.daemon.test_logging:registry"]
    config["logging"] = {"format": "json", "file": str(path)}
    daemon = Daemon(tmp_path, config).start()
    try:
        parent = daemon.pid
        children = set(daemon.children())
        assert len(children) == 2

        def both_kinds(lines: list[dict[str, Any]]) -> bool:
            parents = [e for e in lines if e["pid"] == parent and e["process"] == "master"]
            kids = {e["pid"] for e in lines if e["process"].startswith("[default] ")}
            return bool(parents) and kids == children

        wait_for("parent and child lines", lambda: both_kinds(entries(path)))
        first = entries(path)
        assert any(e["logger"] == "cairnqd.supervisor" for e in first)
        ready = [e for e in first if e["logger"] == "cairnqd.child"]
        assert {e["process"] for e in ready} == {"[default] 1/2", "[default] 2/2"}
        for entry in first:
            assert {"ts", "level", "logger", "pid", "process", "message"} <= set(entry)
        # With a file set, nothing of ours goes to stderr.
        assert "cairnqd" not in daemon.output()

        path.rename(rotated)
        daemon.signal(signal.SIGUSR1)

        def reopened() -> bool:
            fresh = entries(path)
            pids = {e["pid"] for e in fresh if e["message"] == "log file reopened"}
            status = any(e["message"].startswith("status:\n") for e in fresh)
            return status and pids == {parent, *children}

        wait_for("every process to reopen the file", reopened)
        submit(db, "after-rotate")

        def handled() -> list[dict[str, Any]]:
            return [e for e in entries(path) if e.get("marker") == "after-rotate"]

        (line,) = wait_for("the handler's line in the new file", handled)
        assert line["pid"] in children
        assert line["logger"] == "tests.daemon.logging"
        assert line["message"] == "handled after-rotate"
        # The rotated file has the old lines and none of the new ones.
        old = entries(rotated)
        assert len(old) >= len(first)
        assert not any(e.get("marker") or e["message"].startswith("status:") for e in old)
        assert not any(e["level"] == "DEBUG" for e in entries(path))

        # A reload changes a running child's per-logger levels in place (no roll).
        config["logging"]["loggers"] = {"tests.daemon.logging": "debug"}
        daemon.write_config(config)
        mark = len(daemon.messages)
        daemon.signal(signal.SIGHUP)
        daemon.wait_notify("READY=1", start=mark)
        submitted: list[str] = []

        def debug_line() -> bool:
            # Resubmit until one lands: a child may claim a task a moment before it
            # reads the new settings from its control pipe.
            submitted.append(f"after-reload-{len(submitted)}")
            submit(db, submitted[-1])
            time.sleep(0.2)
            return any(e["level"] == "DEBUG" for e in entries(path))

        wait_for("a debug line after the reload", debug_line)
        assert set(daemon.children()) == children
    finally:
        assert daemon.stop() == 0
