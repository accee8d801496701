"""The lease guard: a handler stops before its lease can end, whatever the database does.

No two executions of one task overlap. At the stop point (`deadline - margin`, margin =
lease / 5) a call's tasks are marked lease-lost and the call is cancelled; at the abort
point (`deadline - margin / 3`) a handler still running is reported to `on_overrun`.
The guard runs on the event loop (docs/architecture.md, "Leases and the lease guard").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cairnqd._inflight import InFlight

if TYPE_CHECKING:
    from cairnqd._calls import Call, CallRunner
    from cairnqd.context import TaskContext

log = logging.getLogger("cairnqd.worker")

OverrunHook = Callable[[Sequence["TaskContext"]], None]


class LeaseGuard:
    """Stops the handler calls of a worker whose leases are about to end."""

    def __init__(
        self, inflight: InFlight, runner: CallRunner, on_overrun: OverrunHook | None = None
    ) -> None:
        self._inflight = inflight
        self._runner = runner
        self.on_overrun = on_overrun
        self.margin_s = inflight.margin_s
        #: How often the guard looks: a quarter of the margin, so a stop is at most
        #: that late and an abort comes before the deadline.
        self.tick_s = self.margin_s / 4

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            self.check()

    def check(self) -> None:
        """Stop the calls that reached their stop point; report those past their abort
        point that are still running."""
        now = self._inflight.clock()
        for call in list(self._runner.active):
            if call.lease_stop:
                if not call.overrun_reported and now >= call.abort_at and call.handler_running():
                    call.overrun_reported = True
                    self._overrun(call)
                continue
            if call.handler_done:
                continue  # what follows is settlement, which checks the lease itself
            deadline, lost = _lease_of(call)
            if deadline is None:
                continue
            if lost or now >= deadline - self.margin_s:
                self._stop(call, deadline, now)

    def _stop(self, call: Call, deadline: float, now: float) -> None:
        call.lease_stop = True
        # From here the handler's writes are refused, and its task is not renewed.
        pending = [ctx for ctx in call.contexts if not ctx.settled]
        for ctx in pending:
            ctx._mark_lost()
        abort_at = deadline - self.margin_s / 3
        # A lease already lost (or a guard that woke late) still gets a moment for the
        # cancellation to land before the handler counts as one that does not stop.
        call.abort_at = max(abort_at, now + self.margin_s / 3)
        log.warning(
            "task %s (%s) attempt %d: lease not renewed for %.1fs; cancelling its handler "
            "before the lease can end",
            pending[0].task_id, pending[0].name, pending[0].attempt,
            now - (deadline - self._inflight.lease_s),
        )  # fmt: skip
        call.cancel()

    def _overrun(self, call: Call) -> None:
        report_overrun(
            call,
            self.on_overrun,
            "did not stop when its lease could not be renewed; its task may now run "
            "elsewhere beside it (a sync handler's thread cannot be cancelled: under "
            "cairnqd the worker process is replaced instead)",
        )


def report_overrun(call: Call, hook: OverrunHook | None, why: str) -> None:
    """A handler that did not stop when told to: its unsettled tasks go to `hook`
    (the daemon's child replaces itself), or without one an error names them and `why`."""
    contexts = [ctx for ctx in call.contexts if not ctx.settled]
    ids = ", ".join(f"{c.task_id} attempt {c.attempt}" for c in contexts)
    if hook is not None:
        try:
            hook(contexts)
        except Exception:
            # The application's code, called from the guard's (or the cancel watch's)
            # look over every call: raising, it ended that look and the watch's task,
            # and from then on no handler was stopped at all. Said, and the watch goes on.
            log.exception("handler of %s %s; the hook that was told raised", ids, why)
        return
    log.error("handler of %s %s", ids, why)


def _lease_of(call: Call) -> tuple[float | None, bool]:
    """The earliest lease deadline among the call's unsettled tasks, and whether any of
    them is already known lost. (None, False) when every task is settled."""
    deadline: float | None = None
    lost = False
    for ctx in call.contexts:
        if ctx.settled:
            continue
        if ctx.lost_lease:
            lost = True
        if deadline is None or ctx.lease_deadline < deadline:
            deadline = ctx.lease_deadline
    return deadline, lost
