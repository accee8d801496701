"""The fault paths a supervisor exists for, on the real daemon with real signals.

Each test reproduces a failure observed on the daemon before its fix (the issue that
reported it lists them): a blocked event loop, a handler past max_run, a backlog the
parent mistook for running work, a parent that stops reading its pipes, a hard stop
that threw finished results away, and SIGKILLs that burned the attempts of tasks that
never ran. Executions are counted from the handlers' own log (`fault_handlers`).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon_faults import (
    all_terminal,
    fault_config,
    submit,
    succeeded_count,
    tasks,
    terminal_count,
)
from tests.support.executions import executions, overlaps
from tests.support.harness import client_call
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

# -- a blocked event loop ----------------------------------------------------------------


def test_a_blocked_loop_gets_its_child_aborted_before_the_lease_expires(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    # lease 6s: the stall bound is 2s, and a lease renewed just before the block runs
    # out 4s after it at the earliest. Before the fix the heartbeat thread kept the
    # child "alive", the lease expired and the task ran again beside the blocked copy.
    log = tmp_path / "runs.log"
    groups = {"g": {"queues": ["q"], "processes": 2, "concurrency": 2, "lease": "6s"}}
    daemon = daemon_factory(fault_config(tmp_path, dialect, db_target, groups)).start()
    payload = {"log": str(log), "seconds": 30, "block_on": [1]}
    ids = submit(dialect, db_target, "f.block", [payload, payload], queue="q", max_attempts=3)
    done = wait_for("both tasks to finish", lambda: all_terminal(dialect, db_target, ids), 60)
    assert [(t.status, t.attempt, t.result) for t in done] == [("succeeded", 2, "attempt 2")] * 2
    runs = executions(log)
    assert sorted((r.attempt, r.ended is not None) for r in runs) == [
        (1, False), (1, False), (2, True), (2, True),
    ]  # fmt: skip
    assert overlaps(log) == [], "an attempt ran while the blocked one's process lived"
    output = daemon.output()
    assert output.count("its event loop has been blocked") == 2
    assert output.count("handed back") >= 2, "given back when the child was reaped"
    assert "in block" in output, "the stack dump shows the blocking handler"
    assert daemon.stop() == 0


@pytest.mark.timing
def test_a_handler_past_max_run_is_stopped_and_its_attempt_failed(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    # Before the fix a 40 s blocking handler with max_run 5s ran its 40 s and
    # succeeded: neither the child's timeout nor the parent's check fired.
    log = tmp_path / "runs.log"
    groups = {
        "g": {
            "queues": ["q"], "processes": 1, "max_run": "2s", "retry_backoff": "6s",
            "retry_backoff_max": "6s",
        }
    }  # fmt: skip
    daemon = daemon_factory(fault_config(tmp_path, "sqlite", sqlite_path, groups)).start()
    payload = {"log": str(log), "seconds": 40, "block_on": [1]}
    started = time.monotonic()
    (task_id,) = submit("sqlite", sqlite_path, "f.block", [payload], queue="q", max_attempts=3)

    def failed_once() -> Any:
        (task,) = tasks("sqlite", sqlite_path, [task_id])
        return task if task.status == "queued" and task.error is not None else None

    retry = wait_for("the overrun attempt to be failed", failed_once, 30)
    assert time.monotonic() - started < 15, "stopped near max_run, not after 40 s"
    assert retry.error["code"] == "max_run_exceeded"
    # The normal retry backoff: equal jitter over 6 s puts the retry 3 to 6 s out.
    assert retry.run_at_ms - retry.updated_at_ms >= 2_900
    done = wait_for("the retry", lambda: all_terminal("sqlite", sqlite_path, [task_id]), 30)
    assert (done[0].status, done[0].attempt) == ("succeeded", 2)
    assert "past max_run" in daemon.output()
    assert daemon.stop() == 0


# -- the parent's view of in-flight work ------------------------------------------------------


def test_a_long_backlog_is_not_mistaken_for_an_overrun(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    # Before the fix the parent counted a task as started when it was claimed ahead,
    # so 20 tasks waiting behind one slot looked like an overrun and the healthy child
    # was SIGKILLed, its tasks handed back on their second attempt.
    log = tmp_path / "runs.log"
    groups = {
        "g": {"queues": ["q"], "processes": 1, "concurrency": 1, "prefetch": 20, "max_run": "2s"}
    }
    daemon = daemon_factory(fault_config(tmp_path, "sqlite", sqlite_path, groups)).start()
    (child,) = wait_for("the child", lambda: list(daemon.children("g")))
    payload = {"log": str(log), "seconds": 0.6}
    ids = submit("sqlite", sqlite_path, "f.quick", [payload] * 25, queue="q")
    done = wait_for("every task", lambda: all_terminal("sqlite", sqlite_path, ids), 90)
    assert {(t.status, t.attempt) for t in done} == {("succeeded", 1)}
    assert list(daemon.children("g")) == [child], "the child was replaced"
    assert "past max_run" not in daemon.output()
    assert daemon.stop() == 0


# -- a parent that stops reading -------------------------------------------------------------


def test_children_keep_working_while_the_parent_is_stopped(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    # Before the fix a child wrote an event per task, blocking, from its event loop: a
    # parent that stopped reading froze every child at ~64 KiB of unread events.
    groups = {"g": {"queues": ["q"], "processes": 2, "concurrency": 4}}
    daemon = daemon_factory(fault_config(tmp_path, "sqlite", sqlite_path, groups)).start()
    before = set(daemon.children("g"))
    ids = submit("sqlite", sqlite_path, "f.quick", [{}] * 4000, queue="q")
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        wait_for(
            "3000 tasks done while the parent is stopped",
            lambda: succeeded_count("sqlite", sqlite_path) >= 3000,
            60,
        )
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    wait_for("every task", lambda: all_terminal("sqlite", sqlite_path, ids), 60)
    assert set(daemon.children("g")) == before, "no child was replaced"
    assert daemon.stop() == 0


# -- a hard stop ---------------------------------------------------------------------------------


def test_quit_writes_results_already_returned(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    # Before the fix QUIT exited at once and a result waiting to be written was lost:
    # the task ran again, or with max_attempts 1 ended failed through the hand-back.
    release = tmp_path / "release"
    groups = {"g": {"queues": ["q"], "processes": 1}}
    daemon = daemon_factory(fault_config(tmp_path, "sqlite", sqlite_path, groups)).start()
    log = tmp_path / "executions.log"
    payload = {"release": str(release), "log": str(log)}
    (task_id,) = submit("sqlite", sqlite_path, "f.gate", [payload], queue="q", max_attempts=1)
    wait_for(
        "the task to run",
        lambda: tasks("sqlite", sqlite_path, [task_id])[0].status == "running",
        30,
    )
    blocker = sqlite3.connect(sqlite_path, isolation_level=None)
    try:
        blocker.execute("begin immediate")  # the result cannot be written for now
        release.touch()
        # The handler returns; its result waits behind our lock.
        wait_for(
            "the handler to return",
            lambda: [e.ended is not None for e in executions(log)] == [True],
        )
        daemon.signal(signal.SIGQUIT)
        # The child is stopping, with the result still unwritten.
        wait_for("the child's hard stop to begin", lambda: "QUIT: stopping" in daemon.output())
    finally:
        blocker.execute("rollback")
        blocker.close()
    assert daemon.proc is not None
    daemon.proc.wait(30)
    (task,) = tasks("sqlite", sqlite_path, [task_id])
    assert (task.status, task.result) == ("succeeded", "released")


# -- SIGKILL chaos under prefetch -------------------------------------------------------------


def ready_children(daemon: Any) -> list[int]:
    return [pid for pid, title in daemon.children().items() if "ready" in title]


def test_sigkill_chaos_never_fails_a_task_that_never_ran(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    # Before the fix each hand-back burned an attempt of every task held in a child's
    # backlog: with prefetch most failed tasks had never run at all.
    log = tmp_path / "runs.log"
    group = {"queues": ["q"], "processes": 2, "concurrency": 8}
    groups = {"a": dict(group), "b": dict(group)}
    daemon = daemon_factory(fault_config(tmp_path, dialect, db_target, groups)).start()
    # Submitted in waves, each followed by a kill while it is being claimed: a fast machine
    # drains 3,000 tasks of 1-5 ms in about a second, and a kill on a timer would miss it.
    ids: list[str] = []
    kills = 0
    deadline = time.monotonic() + 180
    for wave in range(10):
        wait_for("a ready child", lambda: bool(ready_children(daemon)), 60)
        payloads = [{"log": str(log), "seconds": 0.001 + (i % 5) / 1000} for i in range(300)]
        ids += submit(dialect, db_target, "f.quick", payloads, queue="q", max_attempts=3)
        time.sleep(0.05 * (wave % 3))  # vary the moment: mid-claim, mid-run, mid-settle
        ready = ready_children(daemon)
        if ready:
            os.kill(ready[kills % len(ready)], signal.SIGKILL)
            kills += 1
    wait_for(
        "every task to finish",
        lambda: terminal_count(dialect, db_target) >= len(ids),
        deadline - time.monotonic(),
    )
    assert kills >= 5, "the chaos must actually kill children"
    failed: list[Any] = client_call(
        dialect, db_target, lambda c: c.list(status="failed", limit=len(ids))
    )
    ran = {r.task_id for r in executions(log)}
    never_ran = [t.id for t in failed if t.id not in ran]
    assert never_ran == [], f"{len(never_ran)} of {len(failed)} failed tasks never ran"
    # A task fails only when three executions died under it.
    assert len(failed) < 30, f"{len(failed)} failures from {kills} kills"
    assert daemon.stop() == 0


# -- a crash between a handler's return and its result's commit -------------------------


def test_a_crash_after_the_handler_returned_costs_the_task_no_attempt(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    # The child dies after the handler returned and before its result was written (a
    # window of milliseconds that SIGKILL chaos on a loaded machine hits dozens of times
    # in 10,000 tasks). Before the fix the hand-back charged that run's attempt, so a
    # task with max_attempts 1 ended failed although its only run succeeded.
    log, marker = tmp_path / "runs.log", tmp_path / "died"
    config = fault_config(tmp_path, dialect, db_target, {"g": {"queues": ["q"], "processes": 1}})
    config["handlers"] = ["tests.daemon.returned_handlers:registry"]
    daemon = daemon_factory(config).start()
    payload = {"log": str(log), "marker": str(marker)}
    ids = submit(dialect, db_target, "r.die_after_return", [payload], queue="q", max_attempts=1)
    done = wait_for("the task to end", lambda: all_terminal(dialect, db_target, ids), 60)
    assert marker.exists(), "the child died after the first run returned"
    assert [(t.status, t.attempt, t.result) for t in done] == [("succeeded", 1, "done")]
    assert [(r.attempt, r.ended is not None) for r in executions(log)] == [(1, True), (1, True)]
    assert "with an unwritten result kept their attempt" in daemon.output()
    assert daemon.stop() == 0
