"""The deadlines the parent holds its children to: boot, heartbeat, max_run and drain.

A child that does not boot or stops heartbeating in time gets SIGABRT, so its
faulthandler dumps every thread's stack to stderr, then SIGKILL if it is still
there `KILL_GRACE_S` later. A child holding a task 10 s past `max_run` (the worker's
own `max_run` limit did not end it) gets SIGKILL at once. A draining child (a
shutdown, a roll, a shrink, a removed group) that is still there at its drain
deadline (its group's `shutdown_timeout`) gets SIGQUIT, then SIGKILL `QUIT_GRACE_S`
later; the supervisor hands its tasks back once it is reaped. So one long task can
hold up neither a shutdown nor a roll past `shutdown_timeout`.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterable

from cairnqd.config import SupervisorConfig
from cairnqd.daemon.pool import ChildProcess, GroupPool

# Enforced by the supervisor's loop, and logged as such.
log = logging.getLogger("cairnqd.supervisor")

KILL_GRACE_S = 5.0
QUIT_GRACE_S = 2.0


def check_deadlines(pools: Iterable[GroupPool], sup: SupervisorConfig) -> None:
    now = time.monotonic()
    for pool in pools:
        max_run = pool.config.max_run
        for child in pool.children():
            if child.quit_sent_at is not None:
                if now - child.quit_sent_at > QUIT_GRACE_S:
                    child.signal(signal.SIGKILL)
                continue
            if child.drain_deadline is not None and now > child.drain_deadline:
                log.warning(
                    "child %d of %s is still draining at its shutdown_timeout; stopping it "
                    "(its tasks are handed back)", child.pid, child.group,
                )  # fmt: skip
                child.quit(now)
                continue
            if child.abort_sent_at is not None:
                if now - child.abort_sent_at > KILL_GRACE_S:
                    child.signal(signal.SIGKILL)
                continue
            if (
                child.state == "starting"
                and now - child.spawned_at > sup.boot_timeout.total_seconds()
            ):
                _abort(child, "boot_timeout")
            elif (
                child.state != "starting"
                and child.state != "db_wait"
                and (now - child.last_heard > sup.heartbeat_timeout.total_seconds())
            ):
                _abort(child, "heartbeat_timeout")
            elif max_run is not None and any(
                now - task.seen > max_run.total_seconds() + 10 for task in child.in_flight.values()
            ):
                child.kill_reason = "max_run"
                log.error("child %d exceeded max_run by 10s; killing it", child.pid)
                child.signal(signal.SIGKILL)


def _abort(child: ChildProcess, reason: str) -> None:
    log.error("child %d of %s: %s; sending SIGABRT", child.pid, child.group, reason)
    child.kill_reason = reason
    child.abort_sent_at = time.monotonic()
    child.signal(signal.SIGABRT)
