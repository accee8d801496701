"""A cancel stops a running handler under the real daemon, on both dialects.

Before, `cancel` of a running task only flagged its row: a handler that never called
`ctx.canceled()` ran on until `max_run` (minutes) or its end. Now its child sees the
flag within about a second; an async handler is cancelled after `cancel_grace`, and a
handler that does not stop a grace later (a sync one, or one that swallows the
cancellation) gets its child replaced. The task ends `canceled` either way, never
failed or retried; the child's other tasks are handed back and finish once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import gone
from tests.support.daemon_faults import all_terminal, fault_config, submit, tasks
from tests.support.executions import executions
from tests.support.harness import client_call, gauge, scrape
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

HANDLERS = ["tests.daemon.cancel_handlers:registry"]
GRACE_S = 0.5


def _config(tmp_path: Path, dialect: str, target: str, **group: Any) -> dict[str, Any]:
    groups = {
        "g": {"queues": ["q"], "processes": 1, "concurrency": 2, "cancel_grace": "500ms", **group}
    }
    config = fault_config(tmp_path, dialect, target, groups)
    config["handlers"] = HANDLERS
    return config


def _events(log: Path, what: str) -> list[str]:
    """The ids of the tasks with a `what` line in the handlers' log."""
    if not log.exists():
        return []
    return [line.split()[1] for line in log.read_text().splitlines() if line.startswith(what)]


def _cancel(dialect: str, target: str, task_id: str) -> None:
    task = client_call(dialect, target, lambda c: c.cancel(task_id))
    assert task is not None and task.status == "running"


@pytest.mark.timing
def test_an_async_handler_that_ignores_the_cancel_ends_canceled_after_the_grace(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    log = tmp_path / "runs.log"
    daemon = daemon_factory(_config(tmp_path, dialect, db_target)).start()
    (child,) = wait_for("the child", lambda: list(daemon.children("g")))
    (task_id,) = submit(dialect, db_target, "c.ignore", [{"log": str(log)}], queue="q")
    wait_for("the handler to start", lambda: _events(log, "start") == [task_id])
    asked = time.monotonic()
    _cancel(dialect, db_target, task_id)
    (done,) = wait_for("the task to end", lambda: all_terminal(dialect, db_target, [task_id]), 30)
    took = time.monotonic() - asked
    assert (done.status, done.attempt, done.error) == ("canceled", 1, None)
    assert _events(log, "cancelled") == [task_id], "its task was cancelled"
    # At most a poll (1 s) and the grace after the cancel, with slack for a busy host.
    assert took < GRACE_S + 2.5, took
    assert list(daemon.children("g")) == [child], "an async handler that stops costs no child"
    assert daemon.stop() == 0


def test_a_cooperative_handler_ends_before_the_grace(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    log = tmp_path / "runs.log"
    config = _config(tmp_path, dialect, db_target, cancel_grace="1h")
    daemon = daemon_factory(config).start()
    (task_id,) = submit(dialect, db_target, "c.polite", [{"log": str(log)}], queue="q")
    wait_for("the handler to start", lambda: _events(log, "start") == [task_id])
    _cancel(dialect, db_target, task_id)
    (done,) = wait_for("the task to end", lambda: all_terminal(dialect, db_target, [task_id]), 30)
    assert (done.status, done.error) == ("canceled", None)
    assert _events(log, "end") == [task_id]
    assert _events(log, "cancelled") == []
    assert daemon.stop() == 0


@pytest.mark.timing
@pytest.mark.parametrize("handler", ["c.sync_block", "c.swallow"])
def test_a_handler_that_does_not_stop_gets_its_child_replaced(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any, handler: str
) -> None:
    log = tmp_path / "runs.log"
    release = tmp_path / "release"
    config = _config(tmp_path, dialect, db_target)
    # One crash would put the group in crashloop: a cancel's replacement spends nothing.
    config["supervisor"]["restart_budget"] = 1
    daemon = daemon_factory(config).start()
    (child,) = wait_for("the child", lambda: list(daemon.children("g")))
    (stuck,) = submit(dialect, db_target, handler, [{"log": str(log)}], queue="q")
    wait_for("the stuck handler to start", lambda: _events(log, "start") == [stuck])
    (other,) = submit(
        dialect, db_target, "c.gate", [{"log": str(log), "release": str(release)}],
        queue="q", max_attempts=3,
    )  # fmt: skip
    wait_for("both to run in the child", lambda: _events(log, "start") == [stuck, other])
    asked = time.monotonic()
    _cancel(dialect, db_target, stuck)
    (done,) = wait_for("the stuck task", lambda: all_terminal(dialect, db_target, [stuck]), 30)
    took = time.monotonic() - asked
    assert (done.status, done.attempt) == ("canceled", 1), done
    # Two graces, a poll, the abort's second and the hand-back, with slack.
    assert took < 2 * GRACE_S + 6, took
    assert child not in daemon.children("g"), "the child was replaced"
    wait_for("a new child", lambda: len(daemon.children("g")) == 1)
    release.touch()
    (finished,) = wait_for("the other task", lambda: all_terminal(dialect, db_target, [other]), 30)
    assert (finished.status, finished.attempt) == ("succeeded", 2)
    assert _events(log, "end") == [other], "it finished exactly once, the stuck one never"
    runs = [r for r in executions(log) if r.task_id == stuck]
    assert len(runs) == 1, "the canceled task was not run again"
    output = daemon.output()
    assert "did not stop within twice cancel_grace" in output
    assert "aborting it" in output and "replaced: a canceled handler did not stop" in output
    restarts = gauge(
        scrape(daemon.metrics_port()), "cairnq_child_restarts_total", group="g", reason="cancel"
    )
    assert restarts == 1.0
    assert "crash-looping" not in output
    (task,) = tasks(dialect, db_target, [stuck])
    assert task.status == "canceled"
    assert daemon.stop() == 0


@pytest.mark.timing
def test_cancel_grace_is_reloaded_without_replacing_the_children(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    log = tmp_path / "runs.log"
    config = _config(tmp_path, "sqlite", sqlite_path, cancel_grace="1h")
    daemon = daemon_factory(config).start()
    (child,) = wait_for("the child", lambda: list(daemon.children("g")))
    config["groups"]["g"]["cancel_grace"] = "500ms"
    daemon.write_config(config)
    done = daemon.cli("reload", "--wait", "30s")
    assert done.returncode == 0, done.stderr
    assert "settings applied in place: groups.g.cancel_grace" in daemon.output()
    wait_for("the child to take it", lambda: "cancel_grace reloaded: 0.5s" in daemon.output())
    (task_id,) = submit("sqlite", sqlite_path, "c.ignore", [{"log": str(log)}], queue="q")
    wait_for("the handler to start", lambda: _events(log, "start") == [task_id])
    _cancel("sqlite", sqlite_path, task_id)
    (ended,) = wait_for("the end", lambda: all_terminal("sqlite", sqlite_path, [task_id]), 15)
    assert ended.status == "canceled"
    assert _events(log, "cancelled") == [task_id]
    assert list(daemon.children("g")) == [child], "no roll"
    assert daemon.stop() == 0


@pytest.mark.timing
def test_a_child_whose_parent_does_not_replace_it_leaves_by_itself(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    """A parent that does not act on `cancel_stuck` (stopped here; one of older code
    would not know the message) still sees the child go 10 s later."""
    log = tmp_path / "runs.log"
    daemon = daemon_factory(_config(tmp_path, "sqlite", sqlite_path)).start()
    (child,) = wait_for("the child", lambda: list(daemon.children("g")))
    (stuck,) = submit("sqlite", sqlite_path, "c.sync_block", [{"log": str(log)}], queue="q")
    wait_for("the handler to start", lambda: _events(log, "start") == [stuck])
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        _cancel("sqlite", sqlite_path, stuck)
        wait_for("the child to leave by itself", lambda: gone(child), 30)
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    (done,) = wait_for("the task", lambda: all_terminal("sqlite", sqlite_path, [stuck]), 30)
    assert (done.status, done.attempt) == ("canceled", 1)
    assert "the parent did not replace this child" in daemon.output()
    assert daemon.stop() == 0
