"""The cancel watch: a cancel request stops a running handler, whether or not it looks.

`cancel` of a running task only flags its row. While any handler runs, the watch reads
the flags of the worker's running tasks about once a second (one read by primary key,
`cancel_requests`; nothing at all while no handler runs), and the lease renewals mark
them too. Once every task of a call is seen cancel-requested:

- the handler has `cancel_grace` to return by itself (`ctx.canceled()` answers True);
- then an async handler's task is cancelled: its `CancelledError` ends the tasks
  canceled (`_calls`), told apart from a handler's own CancelledError;
- a handler still running `cancel_grace` later (a sync handler's thread, which cannot
  be cancelled, or an async one that swallowed the cancellation) is reported to
  `on_overrun`: the daemon's child has its parent replace it; a bare worker logs it
  and keeps the task held and renewed until the handler returns, so no other
  execution of the task can start beside it.

docs/operations.md, "Cancelling a running task", tells the operator's side.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from cairnqd._heartbeat import end_if_cancelled
from cairnqd._inflight import InFlight
from cairnqd._leaseguard import OverrunHook, report_overrun
from cairnqd.store.base import TaskStore

if TYPE_CHECKING:
    from cairnqd._calls import Call, CallRunner
    from cairnqd.context import TaskContext

log = logging.getLogger("cairnqd.worker")

#: How often the flags of running tasks are read, at most.
POLL_S = 1.0
#: The watch never looks more often than this.
MIN_TICK_S = 0.05
#: `Worker(cancel_grace=...)`'s default, seconds.
DEFAULT_CANCEL_GRACE_S = 10.0

#: The same hook shape as a lease overrun's.
CancelOverrunHook = OverrunHook


class CancelWatch:
    """Stops the handlers of a worker's tasks whose cancel was requested."""

    def __init__(
        self,
        store: TaskStore,
        inflight: InFlight,
        runner: CallRunner,
        grace_s: float = DEFAULT_CANCEL_GRACE_S,
    ) -> None:
        self._store = store
        self._inflight = inflight
        self._runner = runner
        self.on_overrun: CancelOverrunHook | None = None
        self._next_poll = 0.0
        self.grace_s = grace_s

    @property
    def grace_s(self) -> float:
        """Seconds a canceled handler has to return by itself, and then to stop."""
        return self._grace_s

    @grace_s.setter
    def grace_s(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"cancel_grace must be a number of seconds >= 0, got {value!r}")
        self._grace_s = float(value)
        #: A quarter of the grace, so each step comes at most that late, and at most
        #: the poll interval.
        self.tick_s = max(MIN_TICK_S, min(POLL_S, self._grace_s / 4))

    async def run(self) -> None:
        while True:
            # Idle, once per poll interval: a handler that starts is read within it.
            await asyncio.sleep(self.tick_s if self._runner.active else POLL_S)
            if not self._runner.active:
                continue  # nothing runs: no read, no work
            now = self._inflight.clock()
            if now >= self._next_poll:
                self._next_poll = now + POLL_S
                await self.poll()
                end_if_cancelled()  # a cancellation the driver lost (see there)
            self.check()

    async def poll(self) -> None:
        """Read which running tasks have a cancel requested, and mark them seen."""
        watched: dict[str, TaskContext] = {}
        for call in self._runner.active:
            if call.handler_done or call.cancel_seen_at is not None:
                continue
            for ctx in call.contexts:
                if not (ctx.settled or ctx.lost_lease or ctx.cancel_seen):
                    watched[ctx.task_id] = ctx
        if not watched:
            return
        inflight = self._inflight
        try:
            flagged = await self._store.cancel_requests(
                task_ids=list(watched), worker_id=inflight.worker_id
            )
        except Exception as exc:
            inflight.report(exc, {"phase": "cancel_poll"})
            return
        for task_id, attempt in flagged.items():
            seen = watched.get(task_id)
            if seen is not None and seen.attempt == attempt:
                seen._mark_cancel_seen()

    def check(self) -> None:
        """Stop the calls whose grace ended; report those still running a grace later."""
        now = self._inflight.clock()
        grace = self._grace_s
        for call in list(self._runner.active):
            if call.lease_stop:
                continue  # the lease guard has it
            if not call.cancel_stop:
                if call.handler_done:
                    continue
                if call.cancel_seen_at is None:
                    if not _all_cancel_seen(call):
                        continue
                    call.cancel_seen_at = now
                if now >= call.cancel_seen_at + grace:
                    self._stop(call, now)
            elif (
                not call.cancel_overrun_reported
                and now >= call.cancel_stop_at + grace
                and call.handler_running()
            ):
                call.cancel_overrun_reported = True
                self._overrun(call)

    def _stop(self, call: Call, now: float) -> None:
        call.cancel_stop = True
        call.cancel_stop_at = now
        first = call.contexts[0]
        if not call.handler.is_async:
            # A thread cannot be cancelled: it keeps its tasks until it returns.
            log.warning(
                "task %s (%s) attempt %d: canceled, but its sync handler is still running "
                "after cancel_grace %gs",
                first.task_id, first.name, first.attempt, self._grace_s,
            )  # fmt: skip
            return
        log.info(
            "task %s (%s) attempt %d: canceled, and its handler did not return within "
            "cancel_grace %gs; cancelling it",
            first.task_id, first.name, first.attempt, self._grace_s,
        )  # fmt: skip
        call.cancel()

    def _overrun(self, call: Call) -> None:
        report_overrun(
            call,
            self.on_overrun,
            f"did not stop after its cancel (2 x cancel_grace {self._grace_s:g}s); it keeps "
            "its task, renewed, until it returns, and the task then ends canceled (a sync "
            "handler's thread cannot be stopped: under cairnqd the worker process is "
            "replaced instead)",
        )


def _all_cancel_seen(call: Call) -> bool:
    """Whether every unsettled task of the call is cancel-requested (a batch call is
    stopped only when all of its tasks are); False when none is left."""
    pending = [ctx for ctx in call.contexts if not ctx.settled]
    return bool(pending) and all(ctx.cancel_seen and not ctx.lost_lease for ctx in pending)
