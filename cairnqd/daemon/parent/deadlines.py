"""The deadlines the parent holds its children to: boot, liveness, stalls, max_run,
drain, and a canceled handler that did not stop.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta

from cairnqd.config import GroupConfig, SupervisorConfig
from cairnqd.daemon.parent.cadence import Due
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
#: A parent loop that ran its steps this much later than it planned to (stopped,
#: swapped out) does not blame its children for the silence it could not hear.
PARENT_STALL_S = 1.0
#: Not serving yet (booting), or not now (waiting for the database): no heartbeat
#: deadline holds them, and the loop steps them at the busy tick (`cadence.py`).
_NOT_SERVING = ("starting", "db_wait")


def check_deadlines(pools: Iterable[GroupPool], sup: SupervisorConfig) -> None:
    now = time.monotonic()
    for pool in pools:
        for child in pool.children():
            _check_child(pool, child, sup, now)


def next_due(pools: Iterable[GroupPool], sup: SupervisorConfig, now: float) -> Iterator[Due]:
    """When `check_deadlines` could next act on each child, and why: the times its
    comparisons turn (heartbeat, drain, SIGKILL after SIGQUIT or SIGABRT). A child
    booting or waiting for the database is stepped at the busy tick. A stall, an
    overrun or a stuck cancel changes only with a message, which ticks the loop at once
    (`reported_trouble`); one already reported is due now."""
    heartbeat_s = sup.heartbeat_timeout.total_seconds()
    for pool in pools:
        for child in pool.children():
            yield from _child_due(pool.config, child, heartbeat_s, now)


def reported_trouble(child: ChildProcess, group: GroupConfig) -> bool:
    """What the child's last heartbeat said calls for an abort now (a stall, an
    overrun), unless one is under way: the loop then ticks at once, not when due."""
    if child.quit_sent_at is not None or child.abort_sent_at is not None:
        return False
    stalled = child.lag_s > group.stall_bound.total_seconds()
    return stalled or bool(_overruns(child, group.max_run)) or bool(child.cancel_stuck)


def _child_due(
    group: GroupConfig, child: ChildProcess, heartbeat_s: float, now: float
) -> Iterator[Due]:
    pid = child.pid
    if child.quit_sent_at is not None:
        yield Due(child.quit_sent_at + QUIT_GRACE_S, f"SIGKILL of child {pid} after SIGQUIT")
        return
    if child.abort_sent_at is not None:
        yield Due(child.abort_sent_at + _abort_grace_s(child), f"SIGKILL of child {pid}")
        return
    if child.drain_deadline is not None:
        yield Due(child.drain_deadline, f"drain deadline of child {pid}")
    if child.state in _NOT_SERVING:
        yield Due(now, f"child {pid} {child.state}")
    else:
        yield Due(child.last_heard + heartbeat_s, f"heartbeat_timeout of child {pid}")
    if reported_trouble(child, group):
        yield Due(now, f"child {pid} reported trouble")


def _abort_grace_s(child: ChildProcess) -> float:
    fast = child.kill_reason in ("stall", "max_run", "cancel")
    return FAST_KILL_GRACE_S if fast else KILL_GRACE_S


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
        if now - child.abort_sent_at > _abort_grace_s(child):
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
    elif child.state not in _NOT_SERVING and (
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
