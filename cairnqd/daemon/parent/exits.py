"""What the parent does when a child has been reaped.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable

from cairnqd.config import to_ms
from cairnqd.daemon.exitcodes import CONFIG, OK
from cairnqd.daemon.parent.fleet import Fleet
from cairnqd.daemon.parent.interruptions import operator_stopped
from cairnqd.daemon.parent.maintenance import Maintenance
from cairnqd.daemon.parent.metrics import Metrics
from cairnqd.daemon.parent.pool import ChildProcess, GroupPool, Slot
from cairnqd.worker import backoff_delay_ms

log = logging.getLogger("cairnqd.supervisor")

#: How many times one task's attempt is given back because its handler had returned
#: when its child died; past that, its runs count as attempts again.
RETURNED_RESTORES = 2
#: Tasks the parent remembers for that count (oldest forgotten first).
_RESTORES_REMEMBERED = 10_000


class ReturnedRestores:
    """Counts, per task, the attempts given back for results a dead child never wrote."""

    def __init__(self, limit: int = RETURNED_RESTORES) -> None:
        self.limit = limit
        self._given: dict[str, int] = {}

    def allow(self, returned: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """The tasks of `returned` that may have their attempt back, counted as given."""
        allowed = []
        for task_id, attempt in returned:
            given = self._given.pop(task_id, 0)
            if given < self.limit:
                allowed.append((task_id, attempt))
                given += 1
            self._given[task_id] = given  # re-inserted: most recent last
        while len(self._given) > _RESTORES_REMEMBERED:
            del self._given[next(iter(self._given))]
        return allowed


#: How a child told to drain before it was ready may end without having crashed.
_LEFT = (OK, -signal.SIGTERM)


class ChildExits:
    def __init__(
        self,
        fleet: Fleet,
        maintenance: Maintenance,
        metrics: Metrics,
        roll_failed: Callable[[str], None],
    ) -> None:
        self._fleet = fleet
        self._maintenance = maintenance
        self._metrics = metrics
        self._roll_failed = roll_failed
        self._restores = ReturnedRestores()

    def on_exit(self, child: ChildProcess, code: int, *, stopping: bool) -> None:
        """`code` as `Popen.returncode` has it: an exit status, or -signal."""
        where = self._fleet.detach(child)
        self._forget_slot_series(child)
        planned = code == OK and child.bye is not None
        unstarted, returned, started = child.spared()  # read (and closed) whatever the exit
        # A child claims only after `ready` (read from its pipe before it is reaped): one
        # that never said it holds no task, and a hand-back would only queue a write
        # that fails when the database is what kept it from being ready.
        if not planned and child.ready_at is not None:
            self._fail_overruns(child)
            reason = _handback_reason(child, stopping)
            spared = unstarted + self._restores.allow(returned)
            interrupted = started if operator_stopped(child) else []
            # A stalled loop is an abort in the attempt history, not a plain exit.
            why = "stall" if child.kill_reason == "stall" else reason
            self._maintenance.hand_back(child.worker_id, reason, spared, interrupted, why)
        described = describe_exit(code)
        group = where.pool
        if group is None:
            log.info("child %d of removed group %s exited (%s)", child.pid, child.group, described)
        elif planned:
            log.info("child %d of %s exited (%s)", child.pid, group.name, child.bye)
            if child.bye not in ("drain", None):
                self._metrics.child_restart(group.name, str(child.bye))
        elif child.quit_sent_at is not None:
            log.info("child %d of %s stopped (%s)", child.pid, group.name, described)
        elif code in _LEFT and child.drain_deadline is not None and child.ready_at is None:
            # Told to drain while it booted (waiting for the database, say): it left,
            # or the SIGTERM came before its handler was in (still importing). Either
            # way it held no task.
            log.info("child %d of %s left before it was ready (drain)", child.pid, group.name)
        elif where.role == "successor" and where.slot is not None:
            self._failed_successor(group, where.slot, child, described)
        elif code == CONFIG or child.fatal is not None:
            self._cannot_boot(group, child, described)
        else:
            slot = where.slot if where.role == "slot" and not stopping else None
            self._crash(group, slot, child, described)

    def _fail_overruns(self, child: ChildProcess) -> None:
        """Tasks past max_run got the child killed: each is a failed attempt, queued
        ahead of the hand-back, retried after the group's usual backoff."""
        if not child.max_run_kills:
            return
        pools = [p for p in self._fleet.pools() if p.name == child.group]
        if not pools or pools[0].config.max_run is None:
            return
        group = pools[0].config
        assert group.max_run is not None
        for overrun in child.max_run_kills:
            delay = backoff_delay_ms(
                overrun.attempt, to_ms(group.retry_backoff), to_ms(group.retry_backoff_max)
            )
            self._maintenance.fail_task_max_run(
                overrun.id, child.worker_id, group.max_run.total_seconds(), delay
            )

    def _failed_successor(
        self, group: GroupPool, slot: Slot, child: ChildProcess, described: str
    ) -> None:
        error = child.fatal or described
        if child.kill_reason is not None:
            error = f"{error} ({child.kill_reason})"
        when = "before it was ready" if child.ready_at is None else "before it took over"
        kept = f"generation {slot.child.generation}" if slot.child is not None else "no"
        message = (
            f"group {group.name} slot {slot.index}: the new child (pid {child.pid}) ended "
            f"{when}: {error}; the slot keeps its {kept} child"
        )
        if group.stop_roll():
            log.error("roll of group %s stopped: %s", group.name, message)
        else:
            log.error("%s", message)
        self._roll_failed(message)
        self._metrics.child_restart(group.name, "boot_failure")

    def _cannot_boot(self, group: GroupPool, child: ChildProcess, described: str) -> None:
        error = child.fatal or described
        if group.stop_roll():
            log.error("roll of group %s stopped: new child cannot boot: %s", group.name, error)
            self._roll_failed(f"group {group.name} kept generation: {error}")
            return
        self._metrics.child_restart(group.name, "boot_failure")
        group.mark_fatal(error, time.monotonic())

    def _crash(
        self, group: GroupPool, slot: Slot | None, child: ChildProcess, described: str
    ) -> None:
        """`slot` is None when nothing is to be restarted (not a slot's child, or the
        daemon is stopping)."""
        if child.kill_reason == "cancel" and slot is not None:
            # Replaced for the operator's cancel, not for a fault of its own: at once,
            # and without spending the group's restart budget.
            log.warning(
                "child %d of %s replaced: a canceled handler did not stop", child.pid, group.name
            )
            self._metrics.child_restart(group.name, "cancel")
            return
        if child.kill_reason is None and child.proc.returncode == -signal.SIGKILL:
            log.warning("child %d of %s was SIGKILLed (possibly OOM-killed)", child.pid, group.name)
        booting = "" if child.ready_at is not None else " while booting"
        log.warning("child %d of %s died%s (%s)", child.pid, group.name, booting, described)
        if slot is None:
            return
        reason = (child.kill_reason or "crash") if child.ready_at is not None else "boot_failure"
        self._metrics.child_restart(group.name, reason)
        group.on_crash(slot, child, time.monotonic())

    def _forget_slot_series(self, child: ChildProcess) -> None:
        """A child of a slot that no longer exists (shrunk pool, removed group) took
        its slot's RSS series with it."""
        pool = self._fleet.groups.get(child.group)
        if pool is None or child.slot >= len(pool.slots):
            self._metrics.remove_child(child.group, child.slot)


def _handback_reason(child: ChildProcess, stopping: bool) -> str:
    if child.kill_reason == "max_run":
        return "max_run"
    return "shutdown" if stopping else "worker_exit"


def describe_exit(code: int) -> str:
    """`exit 3`, or `signal SIGKILL` for a child a signal ended (`Popen` convention)."""
    if code >= 0:
        return f"exit {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:  # a real-time signal has no name
        return f"signal {-code}"
