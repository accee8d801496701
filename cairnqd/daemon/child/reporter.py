"""What a child tells its parent about its tasks: the worker's observer.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import NamedTuple

from cairnqd.context import TaskContext
from cairnqd.daemon.child.outbox import Outbox
from cairnqd.daemon.child.tally import UNDECODABLE_CODE, Counts, TaskTally
from cairnqd.daemon.starts import FREE, NO_SLOT, RETURNED, STARTED, StartTable
from cairnqd.daemon.wakerole import RoomLook
from cairnqd.daemon.wire.messages import LongestTask, Overrun, Room, encode

#: How often a changed tally is sent.
TALLY_EVERY_S = 0.25
#: The running tasks a heartbeat lists (what a roll or a stop would cut short), at
#: most this many and this many characters of ids and names: a heartbeat stays one
#: atomic pipe write.
RUNNING_LISTED = 16
RUNNING_LISTED_CHARS = 1536
#: A listed task's JSON beyond its id and name: keys, quotes, the age.
_LISTED_OVERHEAD = 40


class RunningReport(NamedTuple):
    executing: int
    overdue: tuple[Overrun, ...]
    longest: LongestTask | None
    #: The longest-running tasks, oldest first (see RUNNING_LISTED).
    running: tuple[LongestTask, ...]


class ChildReporter:
    def __init__(
        self,
        outbox: Outbox,
        starts: StartTable | None,
        buckets: tuple[Sequence[float], Sequence[float]],
        on_finished: Callable[[int], None] | None,
        held: Callable[[], list[TaskContext]],
    ) -> None:
        self._outbox = outbox
        # Without a table from the parent (tests, or none passed) a private one keeps
        # the hooks free of tests for it; nobody reads it.
        self._starts = starts = StartTable.private() if starts is None else starts
        self._marks = starts.marks
        self._reuse = starts.reuse
        self._tally = TaskTally(*buckets)
        self._dirty = False
        self._on_finished = on_finished
        #: The worker's held contexts, as a list copy (`InFlight.contexts`): where the
        #: heartbeat thread finds the running tasks and their start times (on the
        #: worker's clock, `time.monotonic`).
        self._held = held
        self.finished = 0
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the worker's observer -----------------------------------------------------------
    # These run for every task (tens of thousands a second across a pool), so each hook
    # is one call that writes what it must in place: a start-table byte, a counter, a
    # histogram bucket. What a task needs later (its slot, its name's counts, its
    # queue's duration histogram) is found once per claim in `tasks_held`, while the
    # claim's rows are fresh in memory, and kept on its context (`observer_state`).
    # The queue wait (run_at to claim) is counted there too: it is a property of the
    # claim. (At no-op rates a call more per task was measurable in the daemon's
    # throughput: bench/RESULTS.md.)

    def tasks_held(self, contexts: Sequence[TaskContext]) -> None:
        tally = self._tally
        slots = self._starts.held_many([ctx.identity for ctx in contexts])
        queue = name = ""
        named: Counts | None = None
        for ctx, slot in zip(contexts, slots, strict=True):
            task = ctx.task
            if named is None or task.queue != queue or task.name != name:
                queue, name = task.queue, task.name
                named = tally.counts(queue, name)
            # `Histogram.observe`, inline (as in `task_ended`). A task is due at its
            # run_at, but never before it was created: a run_at another client wrote in
            # the past (or negative) counted as a wait of decades.
            due_ms = task.run_at_ms if task.run_at_ms > task.created_at_ms else task.created_at_ms
            wait_s = (task.updated_at_ms - due_ms) / 1000
            if wait_s < 0.0:
                wait_s = 0.0
            waits = named.waits
            if wait_s <= waits.first:
                waits.counts[0] += 1
            else:
                waits.counts[bisect_left(waits.bounds, wait_s)] += 1
            waits.total += wait_s
            ctx.observer_state = named
            ctx.observer_slot = slot
        self._dirty = True

    def task_started(self, ctx: TaskContext) -> None:
        self._marks[ctx.observer_slot] = STARTED
        ctx.observer_state.started += 1
        self._dirty = True

    def task_returned(self, ctx: TaskContext) -> None:
        self._marks[ctx.observer_slot] = RETURNED

    def task_ended(self, ctx: TaskContext, outcome: str, reason: str, duration_s: float) -> None:
        slot = ctx.observer_slot
        self._marks[slot] = FREE
        if slot != NO_SLOT:
            self._reuse(slot)
        if ctx.started_at is None and outcome == "lease_lost":
            # Claimed ahead and dropped before it started: no attempt was made here.
            return
        named = ctx.observer_state
        if outcome == "succeeded":
            named.succeeded += 1
        else:
            named.count_end(outcome, reason)
        # `Histogram.observe`, inline: this is the hottest of the hooks.
        if duration_s < 0.0:
            duration_s = 0.0
        durations = named.durations
        if duration_s <= durations.first:
            durations.counts[0] += 1  # where per-task costs matter: fast tasks
        else:
            durations.counts[bisect_left(durations.bounds, duration_s)] += 1
        durations.total += duration_s
        self._dirty = True
        self.finished += 1
        if self._on_finished is not None:
            self._on_finished(self.finished)

    def undecodable(self, queue: str, name: str) -> None:
        """A row the claim failed because it could not be decoded: a failed attempt
        (reason `undecodable`) that never started here."""
        self._tally.counts(queue, name).count_end("failed", UNDECODABLE_CODE)
        self._dirty = True

    # -- sending the tally ---------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._timer = loop.call_later(TALLY_EVERY_S, self._tick)

    def _tick(self) -> None:
        self.send_tally()
        assert self._loop is not None
        self._timer = self._loop.call_later(TALLY_EVERY_S, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def send_tally(self, *, force: bool = False) -> None:
        """Queue the current tally if it changed since the last one (or `force`)."""
        if self._dirty or force:
            self._dirty = False
            self._outbox.send(encode(self._tally.snapshot()), latest="tally")

    # -- for the heartbeat thread ----------------------------------------------------------

    def running_report(self, max_run_s: float | None) -> RunningReport:
        """How many tasks run, those past `max_run_s`, the longest-running one, and the
        longest-running ones (oldest first, as many as fit `RUNNING_LISTED_CHARS`).
        Safe from another thread: it reads a copy of the worker's held contexts."""
        # One C-level copy (consistent under the GIL), then only the started ones; a
        # context released since the copy was made is no longer running.
        running = [
            (began, ctx)
            for ctx in self._held()
            if (began := ctx.started_at) is not None and not ctx.released
        ]
        now = time.monotonic()
        overdue = tuple(
            Overrun(ctx.task_id, ctx.attempt, round(now - began, 3))
            for began, ctx in running
            if max_run_s is not None and now - began > max_run_s
        )
        longest = None
        listed: list[LongestTask] = []
        if running:
            running.sort(key=lambda item: item[0])
            budget = RUNNING_LISTED_CHARS
            for began, ctx in running[:RUNNING_LISTED]:
                budget -= len(ctx.task_id) + len(ctx.name) + _LISTED_OVERHEAD
                if budget < 0:
                    break
                listed.append(LongestTask(ctx.task_id, ctx.name, round(now - began, 3)))
            began, ctx = running[0]
            longest = LongestTask(ctx.task_id, ctx.name, round(now - began, 3))
        return RunningReport(len(running), overdue, longest, tuple(listed))


class RoomReport(RoomLook):
    """Tells the parent when this child flips between "a task claimed now would start
    at once" and not, so that a relayed wake-up goes to a child with room
    (daemon/parent/wakerouting.py); claiming switched off (quiet, drain) counts as no
    room. A message only when the answer differs from the last one sent."""

    def __init__(self, outbox: Outbox, may_claim: Callable[[], bool]) -> None:
        super().__init__(may_claim)
        self._outbox = outbox
        self._sent: bool | None = None

    def _look(self, room: bool) -> None:
        if room is not self._sent:
            self._sent = room
            self._outbox.send(encode(Room(room)), latest="room")
