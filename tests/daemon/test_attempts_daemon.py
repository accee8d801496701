"""Attempt history written by a real daemon, on SQLite and Postgres: a task that fails,
then has its child aborted for a blocked event loop, then succeeds, keeps one record
per attempt with the outcome, worker, host and error of each; a task whose child is
killed under it is recorded as handed back."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.support.daemon_faults import all_terminal, fault_config, submit
from tests.support.harness import client_call
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def test_failed_then_stall_aborted_then_succeeded(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    # lease 6s: the stall bound is 2s, so the blocked child is aborted and its task
    # handed back long before its lease could expire.
    groups = {
        "g": {
            "queues": ["q"], "processes": 1, "concurrency": 1, "lease": "6s",
            "retry_backoff": "50ms", "retry_backoff_max": "50ms",
        }
    }  # fmt: skip
    daemon = daemon_factory(fault_config(tmp_path, dialect, db_target, groups)).start()
    payload = {"seconds": 30, "fail_on": [1], "block_on": [2]}
    (task_id,) = submit(dialect, db_target, "f.block", [payload], queue="q", max_attempts=3)
    (done,) = wait_for(
        "the task to finish", lambda: all_terminal(dialect, db_target, [task_id]), 90
    )
    assert (done.status, done.attempt) == ("succeeded", 3)

    async def history(c: CairnQ) -> list[Any]:
        return await c.store.attempts.of(task_id)

    records = client_call(dialect, db_target, history)
    assert [(r.attempt, r.outcome, r.detail) for r in records] == [
        (1, "failed", None),
        (2, "aborted", "stall"),
        (3, "succeeded", None),
    ]
    failed, aborted, succeeded = records
    assert failed.error is not None and "planned failure of attempt 1" in failed.error["message"]
    assert "ValueError" in failed.error["details"]["traceback"]
    assert aborted.error is None, "the row's error is attempt 1's, not the abort's"
    assert aborted.worker_id != succeeded.worker_id, "a new child ran attempt 3"
    for record in records:
        assert record.host == socket.gethostname()
        assert record.worker_id is not None and record.worker_id.startswith(f"{record.host}:g.0:")
        assert record.finished_at_ms is not None and record.finished_at_ms >= record.started_at_ms
    assert [r.started_at_ms for r in records] == sorted(r.started_at_ms for r in records)
    assert daemon.stop() == 0


def test_killed_child_hands_back_then_succeeds(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    groups = {"g": {"queues": ["q"], "processes": 1, "concurrency": 1, "lease": "60s"}}
    daemon = daemon_factory(fault_config(tmp_path, dialect, db_target, groups)).start()
    log, release = tmp_path / "runs.log", tmp_path / "release"
    payload = {"log": str(log), "release": str(release)}
    (task_id,) = submit(dialect, db_target, "f.gate", [payload], queue="q", max_attempts=3)
    wait_for("attempt 1 to start", lambda: log.exists() and f"start {task_id} 1" in log.read_text())
    (pid,) = daemon.children("g")
    os.kill(pid, signal.SIGKILL)
    wait_for("attempt 2 to start", lambda: f"start {task_id} 2" in log.read_text(), 60)
    release.touch()
    (done,) = wait_for(
        "the task to finish", lambda: all_terminal(dialect, db_target, [task_id]), 60
    )
    assert (done.status, done.attempt) == ("succeeded", 2)

    async def history(c: CairnQ) -> list[Any]:
        return await c.store.attempts.of(task_id)

    records = client_call(dialect, db_target, history)
    assert [(r.attempt, r.outcome, r.detail, r.error) for r in records] == [
        (1, "handed_back", "worker_exit", None),
        (2, "succeeded", None, None),
    ]
    # Handed back at once, not when its 60 s lease would have run out.
    assert records[0].finished_at_ms is not None
    assert records[0].finished_at_ms - records[0].started_at_ms < 30_000
    assert daemon.stop() == 0
