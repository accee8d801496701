"""What a child tells its parent about its tasks: the worker's observer.

Design note. Nothing here writes a message per task (`daemon.tally` says why). The
observer keeps three things, each for its own reader:

- the start table (`daemon.starts`): a task is recorded when the worker takes it in,
  marked started right before its handler is called and returned when its result is
  queued, in memory the parent reads after this process is gone, to give unstarted
  (and returned but unwritten) tasks their attempt back;
- the tally (`daemon.tally`): cumulative counts, sent a few times a second while they
  change;
- the tasks running now with their start times, which the heartbeat thread reads (it
  runs even while the event loop is blocked) to report the longest-running task and
  any past `max_run`, so the parent can enforce `max_run` from the handler's start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from cairnqd.daemon.messages import LongestTask, Overrun, encode
from cairnqd.daemon.outbox import Outbox
from cairnqd.daemon.starts import StartTable
from cairnqd.daemon.tally import TaskTally
from cairnqd.models import Task

#: How often a changed tally is sent.
TALLY_EVERY_S = 0.25


class ChildReporter:
    def __init__(
        self,
        outbox: Outbox,
        starts: StartTable | None,
        buckets: tuple[Sequence[float], Sequence[float]],
        on_finished: Callable[[int], None] | None,
    ) -> None:
        self._outbox = outbox
        self._starts = starts
        self._tally = TaskTally(*buckets)
        self._dirty = False
        self._on_finished = on_finished
        #: (task id, attempt) -> (monotonic start, task name), written by the loop
        #: thread only; the heartbeat thread reads a copy.
        self.running: dict[tuple[str, int], tuple[float, str]] = {}
        self.finished = 0
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the worker's observer -----------------------------------------------------------

    def task_held(self, task: Task) -> None:
        if self._starts is not None:
            self._starts.held(task.id, task.attempt)

    def task_started(self, task: Task) -> None:
        if self._starts is not None:
            self._starts.started(task.id, task.attempt)
        self.running[(task.id, task.attempt)] = (time.monotonic(), task.name)
        wait_s = (task.updated_at_ms - task.run_at_ms) / 1000
        self._tally.started(task.queue, task.name, wait_s)
        self._dirty = True

    def task_returned(self, task: Task) -> None:
        if self._starts is not None:
            self._starts.returned(task.id, task.attempt)

    def task_ended(self, task: Task, outcome: str, reason: str, duration_s: float) -> None:
        if self._starts is not None:
            self._starts.released(task.id, task.attempt)
        began = self.running.pop((task.id, task.attempt), None)
        if began is None and outcome == "lease_lost":
            # Claimed ahead and dropped before it started: no attempt was made here.
            return
        self._tally.ended(task.queue, task.name, outcome, reason, duration_s)
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
        Safe from another thread: it works on a copy of the running table."""
        running = dict(self.running)  # one C-level copy: consistent under the GIL
        now = time.monotonic()
        overdue = tuple(
            Overrun(task_id, attempt, round(now - began, 3))
            for (task_id, attempt), (began, _) in running.items()
            if max_run_s is not None and now - began > max_run_s
        )
        longest = None
        if running:
            (task_id, _), (began, name) = min(running.items(), key=lambda item: item[1][0])
            longest = LongestTask(task_id, name, round(now - began, 3))
        return len(running), overdue, longest
