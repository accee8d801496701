"""Child processes and the per-group pools that keep them at size.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cairnqd._ids import new_ulid
from cairnqd.config import Config, GroupConfig
from cairnqd.daemon.boot import boot_for
from cairnqd.daemon.handler_probe import child_argv_prefix
from cairnqd.daemon.parent.cadence import Due
from cairnqd.daemon.parent.restart_budget import HEALTHY_AFTER_S, RestartBudget, backoff_s
from cairnqd.daemon.starts import StartTable
from cairnqd.daemon.systemd import child_environment
from cairnqd.daemon.wire.messages import (
    CancelStuck,
    ChildMessage,
    DatabaseTrouble,
    Fatal,
    Goodbye,
    Heartbeat,
    LongestTask,
    Overrun,
    Ready,
    Room,
    Tally,
    encode,
)
from cairnqd.daemon.wire.pipes import MessageReader, MessageWriter

log = logging.getLogger("cairnqd.supervisor")

#: (task id, attempt) pairs, as the start table lists them.
TaskIds = list[tuple[str, int]]


@dataclass
class ChildProcess:
    group: str
    slot: int
    generation: int
    worker_id: str
    proc: subprocess.Popen[bytes]
    events: MessageReader
    control: MessageWriter
    spawned_at: float
    state: str = "starting"  # starting, ready, draining, db_wait, quiet
    ready_at: float | None = None
    last_heard: float = field(default_factory=time.monotonic)
    #: Which held tasks it started, readable after it dies (None: no table).
    starts: StartTable | None = None
    #: From its last heartbeat: tasks running and held, its loop's lag, overruns.
    executing: int = 0
    held: int = 0
    lag_s: float = 0.0
    overdue: tuple[Overrun, ...] = ()
    longest: LongestTask | None = None
    #: Its longest-running tasks, oldest first (the heartbeat's `running`).
    running: tuple[LongestTask, ...] = ()
    #: How long its database has not answered it (0: it does).
    db_down_s: float = 0.0
    #: When its database last refused a write for want of space (None: never).
    full_at: float | None = None
    #: How long its claims and lease renewals have made no progress (0: they do).
    stalled_s: float = 0.0
    #: Its queues it reported paused (`cairnqd pause`), skipped by its claims.
    paused: tuple[str, ...] = ()
    #: Whether a task it claimed now would start at once, as it last said (`room`);
    #: False once it is reaped. `room` also asks that it was not told to stop.
    said_room: bool = False
    #: Its wake-ups whose claim found nothing (from its heartbeat).
    empty_wakes: int = 0
    #: Overruns that got it killed; each is failed as max_run_exceeded once reaped.
    max_run_kills: tuple[Overrun, ...] = ()
    #: The tasks of a canceled handler that did not stop: it asked to be replaced.
    cancel_stuck: tuple[str, ...] = ()
    rss: int = 0
    bye: str | None = None
    fatal: str | None = None
    kill_reason: str | None = None
    abort_sent_at: float | None = None
    #: Asked to drain (SIGTERM) and given until then to finish; None: not draining.
    drain_deadline: float | None = None
    #: When we stopped it hard (SIGQUIT); SIGKILL follows after a grace period.
    quit_sent_at: float | None = None
    #: Lines on its events pipe that were no valid message, and when we last said so.
    malformed: int = 0
    malformed_logged_at: float = float("-inf")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, signum: int) -> None:
        """Signal the child; SIGKILL goes to its whole process group, so what its
        handlers started dies with it. Every other signal is the child's alone (a
        drain lets a running task's processes finish); what is left once the child
        is reaped is ended by `leftovers`."""
        # Already gone: the reaper will tell us how. Not reaped yet, so the pid (and
        # the group it leads) is still this child's.
        with contextlib.suppress(ProcessLookupError):
            if signum == signal.SIGKILL:
                os.killpg(self.pid, signum)
            else:
                os.kill(self.pid, signum)

    @property
    def room(self) -> bool:
        """Whether relayed wake-ups may go to it first (wakerouting.py): it said it has
        room, and we have not told it to stop (a `room` it sent before may come after)."""
        return self.said_room and self.drain_deadline is None and self.quit_sent_at is None

    def retire(self, now: float, timeout_s: float) -> None:
        """Stop claiming and finish what it holds (SIGTERM), within `timeout_s`: past
        that the deadlines stop it hard and its tasks are handed back."""
        deadline = now + timeout_s
        if self.drain_deadline is None or deadline < self.drain_deadline:
            self.drain_deadline = deadline
        self.state = "draining"
        self.signal(signal.SIGTERM)

    def quit(self, now: float) -> None:
        """Stop now (SIGQUIT: the child aborts without a database write); the
        deadlines follow up with SIGKILL."""
        if self.quit_sent_at is None:
            self.quit_sent_at = now
            self.signal(signal.SIGQUIT)

    def on_message(self, message: ChildMessage, now: float) -> None:
        """What the child told us about itself (counting is the metrics' business)."""
        self.last_heard = now
        match message:
            case Ready():
                self.state = "ready"
                self.ready_at = now
                self.rss = message.rss
            case Heartbeat():
                if message.state in ("db_wait", "draining", "quiet"):
                    self.state = message.state
                elif message.state == "run" and self.state == "quiet":
                    self.state = "ready"  # a reload ended the quiet
                self.rss = message.rss
                self.executing, self.held = message.executing, message.held
                self.lag_s, self.overdue = message.lag_s, message.overdue
                self.longest = message.longest
                self.running = message.running
                self.db_down_s = message.db_down_s
                self.stalled_s = message.stalled_s
                self.paused = message.paused
                self.empty_wakes = message.empty_wakes
            case Room():
                self.said_room = message.free
            case Goodbye():
                self.bye = message.reason
            case Fatal():
                self.fatal = message.error
            case CancelStuck():
                self.cancel_stuck = message.tasks or ("(unnamed)",)
            case DatabaseTrouble():
                if message.error_kind == "full":
                    self.full_at = now
                if self.state == "starting":
                    self.state = "db_wait"
            case Tally():
                pass  # counting is the metrics' business

    def count_malformed(self, now: float, log_every_s: float) -> bool:
        """Count a line that was no valid message; True when it is time to say so."""
        self.malformed += 1
        if now - self.malformed_logged_at < log_every_s:
            return False
        self.malformed_logged_at = now
        return True

    def close_pipes(self) -> None:
        for fd in (self.events.fd, self.control.fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def spared(self) -> tuple[TaskIds, TaskIds, TaskIds]:
        """After it died: the (task id, attempt) of each task it held and never started,
        of each whose handler returned but whose result it had not written, and of each
        whose handler was still running. The table is closed on the way out; an
        unreadable one lists nothing, so everything counts as started."""
        table, self.starts = self.starts, None
        if table is None:
            return [], [], []
        try:
            return table.unstarted(), table.returned_unwritten(), table.started_unfinished()
        except (ValueError, OSError) as exc:
            log.error("cannot read the start table of child %d: %s", self.pid, exc)
            return [], [], []
        finally:
            table.close()


@dataclass
class Slot:
    index: int
    child: ChildProcess | None = None
    crashes: int = 0
    restart_at: float = 0.0
    # A surge child spawned by a roll, waiting for `ready` before it replaces `child`.
    successor: ChildProcess | None = None


def worker_id_for(group: str, slot: int) -> str:
    return f"{socket.gethostname()}:{group}.{slot}:{new_ulid()}"


def spawn_child(
    config: Config,
    group: GroupConfig,
    slot: int,
    generation: int,
    wake_lock: str | None = None,
) -> ChildProcess:
    events_r, events_w = os.pipe2(os.O_CLOEXEC)
    control_r, control_w = os.pipe2(os.O_CLOEXEC)
    try:
        starts = StartTable.create()
    except OSError as exc:
        # Without it the hand-back counts every held task as started, as before.
        log.warning("no start table for a child of %s (%s)", group.name, exc)
        starts = None
    passed = (events_w, control_r) if starts is None else (events_w, control_r, starts.fd)
    argv = [
        # -P: the working directory is not on sys.path; python_path is (handler_probe).
        *child_argv_prefix(), "-m", "cairnqd.daemon.child",
        "--parent-pid", str(os.getpid()),
        "--events", str(events_w),
        "--control", str(control_r),
    ]  # fmt: skip
    if starts is not None:
        argv += ["--starts", str(starts.fd)]
    try:
        proc = subprocess.Popen(
            argv,
            pass_fds=passed,
            close_fds=True,
            env=child_environment(),
            # A process group of its own: what its handlers start can be ended with
            # it (daemon/parent/leftovers.py). Out of the terminal's foreground group, a read
            # of the terminal would stop a handler's process (SIGTTIN): no stdin.
            process_group=0,
            stdin=subprocess.DEVNULL,
        )
    except BaseException:
        for fd in (events_r, events_w, control_r, control_w):
            os.close(fd)
        if starts is not None:
            starts.close()
        raise
    os.close(events_w)
    os.close(control_r)
    child = ChildProcess(
        group=group.name,
        slot=slot,
        generation=generation,
        worker_id=worker_id_for(group.name, slot),
        proc=proc,
        events=MessageReader(events_r),
        control=MessageWriter(control_w),
        spawned_at=time.monotonic(),
        starts=starts,
    )
    boot = boot_for(config, group, slot, generation, child.worker_id, wake_lock)
    if not child.control.send_whole(encode(boot)):
        log.error("could not send boot to child %d: its pipe is closed", child.pid)
    return child


class GroupPool:
    """One group's slots, state (running, crashloop, fatal) and restart pacing."""

    def __init__(self, config: GroupConfig, fingerprint: str, sup_config: Config) -> None:
        self.config = config
        self.fingerprint = fingerprint
        self.slots = [Slot(i) for i in range(config.processes)]
        self.state = "running"
        self.fatal_error: str | None = None
        self.fatal_at = 0.0
        supervisor = sup_config.supervisor
        self.budget = RestartBudget(
            supervisor.restart_budget, supervisor.restart_window.total_seconds()
        )
        self.backoff_cap_s = supervisor.backoff_max.total_seconds()
        self.fatal_cooldown_s = supervisor.fatal_cooldown.total_seconds()
        self.retired: list[ChildProcess] = []  # draining children no slot owns any more
        #: Slots a roll has yet to replace, in order; None when not rolling.
        self.roll: list[int] | None = None

    @property
    def name(self) -> str:
        return self.config.name

    def children(self) -> list[ChildProcess]:
        found = [s.child for s in self.slots if s.child is not None]
        found += [s.successor for s in self.slots if s.successor is not None]
        return found + self.retired

    def state_counts(self) -> dict[str, int]:
        counts = {"starting": 0, "ready": 0, "draining": 0, "backoff": 0}
        now = time.monotonic()
        for slot in self.slots:
            if slot.child is None:
                if slot.restart_at > now:
                    counts["backoff"] += 1
                continue
            key = slot.child.state if slot.child.state in counts else "ready"
            counts[key] += 1
        counts["draining"] += len(self.retired)
        return counts

    def reconfigure(self, config: GroupConfig, fingerprint: str, sup_config: Config) -> None:
        """Take a reloaded config; its `processes` is applied by `resize`."""
        self.config, self.fingerprint = config, fingerprint
        supervisor = sup_config.supervisor
        self.budget.configure(supervisor.restart_budget, supervisor.restart_window.total_seconds())
        self.backoff_cap_s = supervisor.backoff_max.total_seconds()
        self.fatal_cooldown_s = supervisor.fatal_cooldown.total_seconds()

    def resize(self, processes: int) -> list[ChildProcess]:
        """Grow or shrink to `processes` slots; returns the children of removed slots,
        now retired, for the caller to stop."""
        retiring: list[ChildProcess] = []
        while len(self.slots) > processes:
            slot = self.slots.pop()
            for child in (slot.child, slot.successor):
                if child is not None:
                    retiring.append(child)
        while len(self.slots) < processes:
            self.slots.append(Slot(len(self.slots)))
        self.retired.extend(retiring)
        return retiring

    def retire_all(self) -> list[ChildProcess]:
        """Every child becomes retired (the group was removed); returns them."""
        retiring = [c for s in self.slots for c in (s.child, s.successor) if c is not None]
        self.slots = []
        self.retired.extend(retiring)
        self.roll = None
        return retiring

    def detach(self, child: ChildProcess) -> tuple[str, Slot | None] | None:
        """Remove a dead child from wherever this pool holds it. Returns its role
        (`slot`, `successor` or `retired`) and slot, or None if it is not ours."""
        if child in self.retired:
            self.retired.remove(child)
            return "retired", None
        for slot in self.slots:
            if slot.child is child:
                slot.child = None
                return "slot", slot
            if slot.successor is child:
                slot.successor = None
                return "successor", slot
        return None

    # -- rolling ----------------------------------------------------------------------------

    @property
    def rolling(self) -> bool:
        return self.roll is not None

    def start_roll(self) -> None:
        """Replace every running child, slot by slot (see `advance_roll`)."""
        self.roll = [s.index for s in self.slots if s.child is not None]

    def stop_roll(self) -> bool:
        """End the roll (a new child could not boot); False if none was going on.
        Children not yet replaced keep serving."""
        rolling, self.roll = self.roll is not None, None
        return rolling

    def advance_roll(self, surge: int, spawn: Callable[[int], ChildProcess]) -> list[ChildProcess]:
        """One step of a roll, at most `surge` replacements at a time: a ready
        successor takes its slot, the old child retires (returned, for the caller to
        stop), and the next slot gets a successor from `spawn(slot index)` once fewer
        than `surge` are in progress. Capacity never drops below the pool's size."""
        retiring = self._promote_ready_successors()
        if self.roll is None:
            return retiring
        in_progress = sum(1 for s in self.slots if s.successor is not None)
        in_progress += len(self.retired)
        while self.roll and in_progress < surge:
            index = self.roll.pop(0)
            if index >= len(self.slots) or self.slots[index].child is None:
                continue  # gone meanwhile; it restarts with the new config
            self.slots[index].successor = spawn(index)
            in_progress += 1
        if not self.roll and in_progress == 0:
            self.roll = None
        return retiring

    def _promote_ready_successors(self) -> list[ChildProcess]:
        retiring = []
        for slot in self.slots:
            successor = slot.successor
            if successor is not None and successor.state == "ready":
                old, slot.child, slot.successor = slot.child, successor, None
                if old is not None:
                    self.retired.append(old)
                    retiring.append(old)
        return retiring

    def on_crash(self, slot: Slot, child: ChildProcess, now: float) -> None:
        """A crash, before or after ready (a kill by us included): pace the restart,
        spend budget. Never FATAL by itself: five OOM kills during boot must not
        disable a group for good."""
        if child.ready_at is not None and now - child.ready_at >= HEALTHY_AFTER_S:
            slot.crashes = 0
        slot.crashes += 1
        self.budget.spend(now)
        slot.restart_at = now + backoff_s(slot.crashes, self.backoff_cap_s)
        if self.budget.exhausted(now) and self.state == "running":
            self.state = "crashloop"
            log.critical(
                "group %s is crash-looping: %d restarts in %.0fs; dead slots stay empty "
                "until the window has room",
                self.name, self.budget.budget, self.budget.window_s,
            )  # fmt: skip

    def mark_fatal(self, error: str, now: float) -> None:
        """A child cannot boot, and the next would not either: stop spawning until
        the cool-down has passed (or a reload). Children still running serve on."""
        if self.state != "fatal":
            self.state = "fatal"
            self.fatal_error = error
            self.fatal_at = now
            log.critical(
                "group %s is FATAL: %s; trying again in %.0fs or on reload",
                self.name, error, self.fatal_cooldown_s,
            )  # fmt: skip

    def revive(self) -> None:
        """Leave FATAL with a fresh budget: a fixed handler module needs no restart."""
        self.state = "running"
        self.fatal_error = None
        self.budget.reset()
        for slot in self.slots:
            slot.crashes, slot.restart_at = 0, 0.0

    def cooled_down(self, now: float) -> bool:
        """FATAL for at least `supervisor.fatal_cooldown`: time to try again."""
        return self.state == "fatal" and now - self.fatal_at >= self.fatal_cooldown_s

    def next_spawn(self, now: float) -> Due | None:
        """When `Fleet.fill` could next spawn into this pool, if it has an empty slot:
        once the FATAL cool-down ends, once the earliest backoff ends, or (crash-looping)
        at the busy tick, which looks whether the restart window has room."""
        if self.state == "fatal":
            return Due(self.fatal_at + self.fatal_cooldown_s, f"group {self.name} cool-down")
        empty = [slot for slot in self.slots if slot.child is None]
        if not empty:
            return None
        if self.state == "crashloop":
            return Due(now, f"group {self.name} crash-looping")
        slot = min(empty, key=lambda s: s.restart_at)
        return Due(slot.restart_at, f"restart of {self.name}/{slot.index}")

    def may_spawn(self, slot: Slot, now: float) -> bool:
        if self.state == "fatal" or slot.restart_at > now:
            return False
        if self.state == "crashloop":
            if self.budget.exhausted(now):
                return False
            self.state = "running"
            log.warning("group %s leaves crashloop: the restart window has room", self.name)
        return True
