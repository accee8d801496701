"""The deadlines the parent holds its children to: boot, liveness, stalls, max_run,
drain, and a canceled handler that did not stop.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterable
from datetime import timedelta

from cairnqd.config import SupervisorConfig
from cairnqd.daemon.parent.pool import ChildProcess, GroupPool
from cairnqd.daemon.wire.messages import Overrun

# Enforced by the supervisor's loop, and logged as such.
log = logging.getLogger("cairnqd.supervisor")

KILL_GRACE_S = 5.0
#: After SIGABRT for a stall or an overrun: the dump takes milliseconds.
FAST_KILL_GRACE_S = 1.0
QUIT_GRACE_S = 2.0
#: How long past `max_run` the parent waits for the child's own timeout to act.
MAX_RUN_GRACE_S = 2.0
#: A parent loop that went this long without a tick (stopped, swapped out) does not
#: blame its children for the silence it could not hear.
PARENT_STALL_S = 1.0


def check_deadlines(pools: Iterable[GroupPool], sup: SupervisorConfig) -> None:
    now = time.monotonic()
    for pool in pools:
        for child in pool.children():
            _check_child(pool, child, sup, now)


def forgive_silence(pools: Iterable[GroupPool], now: float) -> None:
    """The parent itself stalled: count every child as heard from now."""
    for pool in pools:
        for child in pool.children():
            child.last_heard = max(child.last_heard, now)


def _check_child(pool: GroupPool, child: ChildProcess, sup: SupervisorConfig, now: float) -> None:
    if child.quit_sent_at is not None:
        if now - child.quit_sent_at > QUIT_GRACE_S:
            child.signal(signal.SIGKILL)
        return
    if child.abort_sent_at is not None:
        fast = child.kill_reason in ("stall", "max_run", "cancel")
        grace = FAST_KILL_GRACE_S if fast else KILL_GRACE_S
        if now - child.abort_sent_at > grace:
            child.signal(signal.SIGKILL)
        return
    stall_s = pool.config.stall_bound.total_seconds()
    max_run = pool.config.max_run
    if child.drain_deadline is not None and now > child.drain_deadline:
        log.warning(
            "child %d of %s is still draining at its shutdown_timeout; stopping it "
            "(its tasks are handed back)", child.pid, child.group,
        )  # fmt: skip
        child.quit(now)
    elif child.state == "starting" and now - child.spawned_at > sup.boot_timeout.total_seconds():
        _abort(child, "boot_timeout", "not ready within supervisor.boot_timeout")
    elif child.state not in ("starting", "db_wait") and (
        now - child.last_heard > sup.heartbeat_timeout.total_seconds()
    ):
        _abort(child, "heartbeat_timeout", "silent for longer than supervisor.heartbeat_timeout")
    elif child.lag_s > stall_s:
        _abort(
            child,
            "stall",
            f"its event loop has been blocked for {child.lag_s:.1f}s (stall_timeout "
            f"{stall_s:g}s: a blocking call in an async handler?); its tasks go back "
            "before their leases expire",
        )
    elif overruns := _overruns(child, max_run):
        assert max_run is not None
        child.max_run_kills = overruns
        listed = ", ".join(f"{o.id} ({o.age_s:.1f}s)" for o in overruns)
        _abort(child, "max_run", f"task(s) past max_run {max_run.total_seconds():g}s: {listed}")
    elif child.cancel_stuck:
        stuck = ", ".join(child.cancel_stuck)
        _abort(
            child,
            "cancel",
            f"the canceled handler of {stuck} did not stop within twice cancel_grace; its "
            "task ends canceled, the child's other tasks are handed back",
        )


def _overruns(child: ChildProcess, max_run: timedelta | None) -> tuple[Overrun, ...]:
    if max_run is None:
        return ()
    limit = max_run.total_seconds() + MAX_RUN_GRACE_S
    return tuple(o for o in child.overdue if o.age_s > limit)


def _abort(child: ChildProcess, reason: str, why: str) -> None:
    log.error(
        "child %d of %s: %s; aborting it (SIGABRT: its stacks follow in the log)",
        child.pid, child.group, why,
    )  # fmt: skip
    child.kill_reason = reason
    child.abort_sent_at = time.monotonic()
    child.signal(signal.SIGABRT)
