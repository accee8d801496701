"""An operator's stop is not the task's fault, under the real daemon on both dialects.

A roll that outlasts its group's shutdown_timeout cuts a running task short: it goes
back to the queue with its attempt given back, at most OPERATOR_RESTORES times per
task, and `reload --wait` names it before it starts. A crash still costs the attempt;
a roll whose tasks finish in time cuts nothing.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from cairnqd.daemon.parent.interruptions import OPERATOR_RESTORES
from tests.support.daemon import base_config
from tests.support.harness import client_call, database_section
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def _daemon(
    tmp_path: Path, dialect: str, db: str, daemon_factory: Any, shutdown_timeout: str
) -> tuple[Any, dict[str, Any]]:
    group = {"queues": ["q"], "processes": 1, "concurrency": 1, "lease": "60s",
             "shutdown_timeout": shutdown_timeout}  # fmt: skip
    config = base_config(tmp_path, database_section(dialect, db), {"g": group})
    return daemon_factory(config).start(), config


def _submit(dialect: str, db: str, name: str, payload: Any, max_attempts: int) -> Any:
    async def submit(c: CairnQ) -> Any:
        return await c.submit(name, payload, queue="q", max_attempts=max_attempts)

    return client_call(dialect, db, submit)


def _get(dialect: str, db: str, task_id: str) -> Any:
    return client_call(dialect, db, lambda c: c.get(task_id))


def _started_on(daemon: Any, task_id: str, other_than: int | None = None) -> int:
    """The pid of the child whose handler runs `task_id` (a heartbeat said so)."""

    def child() -> int | None:
        pid = daemon.running_tasks("g").get(task_id)
        return pid if pid is not None and pid != other_than else None

    return wait_for(f"the handler of {task_id} to run", child, 60)


@pytest.mark.timing
def test_a_roll_past_shutdown_timeout_gives_the_attempt_back(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    daemon, config = _daemon(tmp_path, dialect, db_target, daemon_factory, "1s")
    release = tmp_path / "release"
    # One attempt only: were the cut counted, the task would end failed.
    task = _submit(dialect, db_target, "t.block", {"until": str(release)}, max_attempts=1)
    old = _started_on(daemon, task.id)
    config["groups"]["g"]["lease"] = "45s"  # a change that rolls the group
    daemon.write_config(config)
    done = daemon.cli("reload", "--wait", "40s")
    assert done.returncode == 0, (done.stdout, done.stderr, daemon.output())
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "group g: rolling it will interrupt 1 running task unless it finishes within its "
        "shutdown_timeout (1.0s):"
    ), done.stdout
    assert lines[1].startswith(f"  {task.id} t.block (running "), done.stdout
    # The new child runs it again, under the attempt the cut one had.
    new = _started_on(daemon, task.id, other_than=old)
    again = _get(dialect, db_target, task.id)
    assert (again.status, again.attempt) == ("running", 1), again
    assert "1 cut short by the operator got their attempt back" in daemon.output()
    release.touch()
    finished = client_call(dialect, db_target, lambda c: c.wait(task.id, timeout_ms=30_000))
    assert (finished.status, finished.attempt) == ("succeeded", 1), finished
    assert finished.result["pid"] == new
    # Both runs are on record: the cut one named after the operator's stop, though
    # its attempt was given back.
    records = client_call(dialect, db_target, lambda c: c.store.attempts.of(task.id))
    assert [(r.attempt, r.outcome, r.detail) for r in records] == [
        (1, "handed_back", "operator"),
        (1, "succeeded", None),
    ], records
    assert daemon.stop() == 0


@pytest.mark.timing
def test_past_the_cap_a_roll_costs_the_attempt(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    daemon, _ = _daemon(tmp_path, dialect, db_target, daemon_factory, "500ms")
    task = _submit(dialect, db_target, "t.block", {"until": str(tmp_path / "never")}, 1)
    pid = _started_on(daemon, task.id)
    for cut in range(1, OPERATOR_RESTORES + 1):
        done = daemon.cli("reload", "--all", "--wait", "40s")
        assert done.returncode == 0, (done.stdout, done.stderr, daemon.output())
        pid = _started_on(daemon, task.id, other_than=pid)
        again = _get(dialect, db_target, task.id)
        assert (again.status, again.attempt) == ("running", 1), (cut, again)
    # One cut more than the cap: it counts, and a single attempt is spent.
    done = daemon.cli("reload", "--all", "--wait", "40s")
    assert done.returncode == 0, (done.stdout, done.stderr, daemon.output())

    def ended() -> Any:
        got = _get(dialect, db_target, task.id)
        return got if got.status == "failed" else None

    failed = wait_for("the task to end failed", ended, 30)
    assert failed.attempt == 1 and failed.error["code"] == "lease_expired", failed
    assert daemon.stop() == 0


def test_a_crash_still_costs_the_attempt(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    daemon, _ = _daemon(tmp_path, dialect, db_target, daemon_factory, "10s")
    release = tmp_path / "release"
    task = _submit(dialect, db_target, "t.block", {"until": str(release)}, max_attempts=2)
    old = _started_on(daemon, task.id)
    os.kill(old, signal.SIGKILL)
    new = _started_on(daemon, task.id, other_than=old)
    again = _get(dialect, db_target, task.id)
    assert (again.status, again.attempt) == ("running", 2), again
    release.touch()
    finished = client_call(dialect, db_target, lambda c: c.wait(task.id, timeout_ms=30_000))
    assert (finished.status, finished.attempt, finished.result["pid"]) == ("succeeded", 2, new)
    assert "cut short by the operator" not in daemon.output()
    assert daemon.stop() == 0


@pytest.mark.timing
def test_a_roll_waits_for_a_task_that_finishes_within_shutdown_timeout(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    daemon, _ = _daemon(tmp_path, dialect, db_target, daemon_factory, "30s")
    task = _submit(dialect, db_target, "t.sleep", {"seconds": 2}, max_attempts=1)
    old = _started_on(daemon, task.id)
    done = daemon.cli("reload", "--all", "--wait", "40s")
    assert done.returncode == 0, (done.stdout, done.stderr, daemon.output())
    assert "rolling it will interrupt 1 running task" in done.stdout
    finished = client_call(dialect, db_target, lambda c: c.wait(task.id, timeout_ms=30_000))
    # The old child finished it while the new one took its slot: nothing was cut.
    assert (finished.status, finished.attempt, finished.result["pid"]) == ("succeeded", 1, old)
    assert "still draining at its shutdown_timeout" not in daemon.output()
    assert old not in daemon.children("g")
    assert daemon.stop() == 0
