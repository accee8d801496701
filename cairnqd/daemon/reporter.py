"""What a child tells its parent about its tasks: the worker's observer.

Design note. Nothing here writes a message per task (`daemon.tally` says why). The
observer keeps three things, each for its own reader:

- the start table (`daemon.starts`): a task is recorded when the worker takes it in,
  marked started right before its handler is called and returned when its result is
  queued, in memory the parent reads after this process is gone, to give unstarted
  (and returned but unwritten) tasks their attempt back;
- the tally (`daemon.tally`): cumulative counts, sent a few times a second while they
  change;
- nothing for the tasks running now: the heartbeat thread (it runs even while the
  event loop is blocked) reads the worker's own held contexts and their start times to
  report the longest-running task and any past `max_run`, so the parent can enforce
  `max_run` from the handler's start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from cairnqd.context import TaskContext
from cairnqd.daemon.messages import LongestTask, Overrun, encode
from cairnqd.daemon.outbox import Outbox
from cairnqd.daemon.starts import NO_SLOT, StartTable
from cairnqd.daemon.tally import Record, TaskTally

#: How often a changed tally is sent.
TALLY_EVERY_S = 0.25


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
        self._starts = starts
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
    # These run for every task (tens of thousands a second across a pool). What a task
    # needs later (its start-table slot, its tally record) is found once, in
    # `tasks_held`, while the claim's rows are fresh in memory, and kept on its context
    # (`observer_state`): marking a start is then a byte written and a field
    # incremented, with no lookup between the claim and the handler. The queue wait
    # (run_at to claim) is counted there too: it is a property of the claim.

    def tasks_held(self, contexts: Sequence[TaskContext]) -> None:
        starts, tally = self._starts, self._tally
        queue = name = ""
        record: Record | None = None
        for ctx in contexts:
            task = ctx.task
            if record is None or task.queue != queue or task.name != name:
                queue, name = task.queue, task.name
                record = tally.record(queue, name)
            tally.waited_in(record, (task.updated_at_ms - task.run_at_ms) / 1000)
            slot = NO_SLOT if starts is None else starts.held(task.id, task.attempt)
            ctx.observer_state = (slot, record)
        self._dirty = True

    def task_started(self, ctx: TaskContext) -> None:
        slot, record = ctx.observer_state
        if self._starts is not None:
            self._starts.started(slot)
        TaskTally.started_in(record)
        self._dirty = True

    def task_returned(self, ctx: TaskContext) -> None:
        if self._starts is not None:
            self._starts.returned(ctx.observer_state[0])

    def task_ended(self, ctx: TaskContext, outcome: str, reason: str, duration_s: float) -> None:
        slot, record = ctx.observer_state
        if self._starts is not None:
            self._starts.released(slot)
        if ctx.started_at is None and outcome == "lease_lost":
            # Claimed ahead and dropped before it started: no attempt was made here.
            return
        TaskTally.ended_in(record, outcome, reason, duration_s)
        self._dirty = True
        self.finished += 1
        if self._on_finished is not None:
            self._on_finished(self.finished)

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

    def running_report(
        self, max_run_s: float | None
    ) -> tuple[int, tuple[Overrun, ...], LongestTask | None]:
        """How many tasks run, those past `max_run_s`, and the longest-running one.
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
        if running:
            began, ctx = min(running, key=lambda item: item[0])
            longest = LongestTask(ctx.task_id, ctx.name, round(now - began, 3))
        return len(running), overdue, longest
