"""What a worker holds: the in-flight table its parts share.

Tasks are keyed by (task id, attempt), each with a local lease deadline; a task starts
only before its stop point, "started" means its handler was called, and every way out
goes through `release()`, which reports the end once (docs/architecture.md, "The
in-flight table").
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from cairnqd._lograte import Burst
from cairnqd.models import Task
from cairnqd.queue_counts import WAIT, QueueTally
from cairnqd.tracing import end as end_span

if TYPE_CHECKING:
    from cairnqd.context import TaskContext

log = logging.getLogger("cairnqd.worker")

Identity = tuple[str, int]
ErrorReporter = Callable[[BaseException, dict[str, Any]], None]

#: How far before a lease's local deadline its handler is stopped, as a share of the
#: lease, and never less than `MIN_MARGIN_S` (see `_leaseguard`).
MARGIN_SHARE = 0.2
MIN_MARGIN_S = 0.05


def lease_margin_s(lease_s: float) -> float:
    return max(lease_s * MARGIN_SHARE, MIN_MARGIN_S)


class WorkerObserver(Protocol):
    """Hooks a host process (the daemon's child) uses to follow a worker's tasks.

    `tasks_held` runs when claimed tasks are taken into the worker (once per claim);
    `task_started` runs synchronously right before a handler is called; `task_returned`
    right after a handler returned a result that is now queued for writing; `task_ended`
    runs once for every task the worker held, started or not, with the outcome:
    succeeded, failed, retried, canceled, or lease_lost (written by nobody: the lease
    was gone, or the result could not be written). Each gets the context itself: a
    context object is one attempt (two attempts of one task are two contexts), so a
    host can key its own bookkeeping by it, and read `ctx.started_at` rather than keep
    a clock of its own."""

    def tasks_held(self, contexts: Sequence[TaskContext]) -> None: ...

    def task_started(self, ctx: TaskContext) -> None: ...

    def task_returned(self, ctx: TaskContext) -> None: ...

    def task_ended(
        self, ctx: TaskContext, outcome: str, reason: str, duration_s: float
    ) -> None: ...


class Progress:
    """How long the worker's database calls that it needs (claims, lease renewals,
    result writes) have gone without one succeeding. A call that fails, or has not
    answered yet, is no progress; any success is. An idle worker whose last calls
    succeeded is not stalled, however long it waits for work.

    Read from another thread (the daemon child's heartbeat), so `stalled_s` only reads.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._outstanding = 0
        #: Since when no call has succeeded while one was needed; None: progressing.
        self._since: float | None = None

    def begin(self) -> None:
        if self._since is None:
            self._since = self._clock()
        self._outstanding += 1

    def succeeded(self) -> None:
        self._outstanding -= 1
        # Others still out count from now: this one got through, the database answers.
        self._since = None if self._outstanding <= 0 else self._clock()

    def failed(self) -> None:
        self._outstanding -= 1  # `_since` stays: still no progress

    def stalled_s(self) -> float:
        since = self._since
        return 0.0 if since is None else max(0.0, self._clock() - since)


class LoopState:
    """The claim loop's flags that other parts read, and the events that wake it."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        #: Set when a call slot or a resource frees up, a result is due, or on stop.
        self.freed = asyncio.Event()
        self.looping = False  # inside the claim loop: its claims carry queued results
        self.idling = False  # waiting for work: no claim is coming soon
        self.claiming = True  # False while a host keeps the worker quiet
        self.has_handlers = False
        #: The prefetch target the claim loop last worked to (0: not claiming ahead).
        self.ahead = 0

    def wake(self) -> None:
        """Cut the claim loop's wait short."""
        self.freed.set()

    def claims_will_settle(self) -> bool:
        """Whether a claim will soon carry queued results (else a flusher must)."""
        return (
            self.looping
            and not self.idling
            and self.claiming
            and self.has_handlers
            and not self.stop.is_set()
        )


class InFlight:
    """Every task a worker holds, keyed by (task id, attempt)."""

    def __init__(
        self,
        lease_ms: int,
        report: ErrorReporter,
        worker_id: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: The monotonic clock every lease deadline is read against (tests inject one).
        self.clock = clock
        self.lease_ms = lease_ms
        self.lease_s = lease_ms / 1000
        self.margin_s = lease_margin_s(self.lease_s)
        self.report = report
        # A worker can lose hundreds of leases at once (a full disk refuses every
        # write): a few lines name their tasks, then one says how many more there were.
        self._lost_lines = Burst()
        self.worker_id = worker_id
        self.observer: WorkerObserver | None = None
        #: Per-queue counts of waits and outcomes for the dashboard's charts
        #: (cairnqd/queue_counts.py), or None where the worker keeps none.
        self.tally: QueueTally | None = None
        self._held: dict[Identity, TaskContext] = {}
        #: Held tasks claimed ahead of a free slot, in the order they should start.
        self.backlog: collections.deque[TaskContext] = collections.deque()
        self.executing = 0
        #: Tasks whose handler call has ended (returned, raised or was abandoned).
        self.handled = 0
        self.in_use: dict[str, int] = {}
        #: Whether the claims, renewals and result writes get through (health).
        self.progress = Progress(clock)

    def __len__(self) -> int:
        return len(self._held)

    def contexts(self) -> list[TaskContext]:
        return list(self._held.values())

    def holds(self, ctx: TaskContext) -> bool:
        return self._held.get(ctx.identity) is ctx

    # -- claim, start, release -------------------------------------------------------

    def hold(self, contexts: Sequence[TaskContext], claim_sent_at: float) -> None:
        """Track claimed tasks; their lease is ours until `claim_sent_at + lease`."""
        deadline = claim_sent_at + self.lease_s
        held = self._held
        for ctx in contexts:
            ctx.lease_deadline = deadline
            held[ctx.identity] = ctx
        if self.observer is not None:
            self.observer.tasks_held(contexts)

    def stale(self, ctx: TaskContext) -> bool:
        """True (and `ctx` released as lease_lost) when its lease is gone, or too close
        to its end for a handler to run."""
        if ctx.lost_lease or ctx.lease_deadline - self.margin_s <= self.clock():
            ctx._mark_lost()
            self.release(ctx, "lease_lost", "lease expired before the task started")
            return True
        return False

    def begin(self, ctx: TaskContext) -> bool:
        """Mark `ctx` started, right before its handler is called; False (released)
        when it is `stale`."""
        if self.stale(ctx):
            return False
        ctx.started_at = self.clock()
        self.executing += 1
        if self.tally is not None:
            now_ms = int(time.time() * 1000)
            task = ctx.task
            self.tally.add(task.queue, WAIT, now_ms - task.run_at_ms, now_ms)
        if self.observer is not None:
            self.observer.task_started(ctx)
        return True

    def returned(self, ctx: TaskContext) -> None:
        """The handler of started `ctx` returned; its result waits to be written."""
        if self.observer is not None:
            self.observer.task_returned(ctx)

    def release(self, ctx: TaskContext, outcome: str, reason: str = "") -> None:
        """Stop holding `ctx` and report its end; later calls are no-ops."""
        if ctx.released:
            return
        ctx.released = True
        if self._held.get(ctx.identity) is ctx:
            del self._held[ctx.identity]
        if ctx.started_at is not None:
            self.executing -= 1
            if ctx.trace_span is not None:
                end_span(ctx, outcome, reason)
        if outcome == "lease_lost":
            held_back = self._lost_lines.admit()
            if held_back is not None:
                _log_lost(ctx, reason, held_back)
        observer, tally = self.observer, self.tally
        if observer is not None or tally is not None:
            began = ctx.started_at
            duration = self.clock() - began if began is not None else 0.0
            if tally is not None:
                tally.add(ctx.task.queue, outcome, duration * 1000)
            if observer is not None:
                observer.task_ended(ctx, outcome, reason, duration)

    def release_settled(self, ctx: TaskContext, task: Task | None, reason: str = "") -> None:
        """Release after a write settled the task (`task` as it now reads)."""
        if task is None:
            self.release(ctx, "lease_lost", reason or "the database refused the write")
            return
        self.release(ctx, "retried" if task.status == "queued" else task.status, reason)

    # -- leases ------------------------------------------------------------------------

    def renewable(self) -> list[TaskContext]:
        """The contexts to heartbeat now. One whose local deadline has passed is
        marked lost instead: the database may have handed it to someone else."""
        now = self.clock()
        live: list[TaskContext] = []
        for ctx in list(self._held.values()):
            if ctx.settled or ctx.lost_lease:
                continue
            if ctx.lease_deadline <= now:
                ctx._mark_lost()
                log.warning(
                    "task %s attempt %d: lease expired locally (no renewal for %.1fs); "
                    "it will not be heartbeated or written by this worker",
                    ctx.task_id, ctx.attempt, self.lease_s,
                )  # fmt: skip
                if ctx.started_at is None:
                    self._drop_waiting(ctx)
                continue
            live.append(ctx)
        return live

    def renewed(
        self,
        sent: Iterable[TaskContext],
        sent_at: float,
        reply: Mapping[str, tuple[int, bool]],
    ) -> None:
        """Apply a heartbeat's reply, {task id: (attempt, cancel requested)} for the
        rows renewed. A row renewed under another attempt is not this context's."""
        for ctx in sent:
            attempt, cancel = reply.get(ctx.task_id, (None, False))
            if attempt != ctx.attempt:
                if not ctx.settled:
                    ctx._mark_lost()
                    if ctx.started_at is None:
                        self._drop_waiting(ctx)
                continue
            # Renewals never move a lease earlier (renew_leases), so one answered after a
            # later one leaves the later end in place, here as in the database.
            ctx.lease_deadline = max(ctx.lease_deadline, sent_at + self.lease_s)
            if cancel:
                ctx._mark_cancel_seen()

    def _drop_waiting(self, ctx: TaskContext) -> None:
        """A backlog task whose lease is gone: never start it."""
        try:
            self.backlog.remove(ctx)
        except ValueError:
            return
        self.release(ctx, "lease_lost", "lease lost while it waited to start")


def _log_lost(ctx: TaskContext, reason: str, held_back: int) -> None:
    state = "after its handler started" if ctx.started_at is not None else "before it started"
    more = f" ({held_back} more lost lease(s) not logged)" if held_back else ""
    log.warning(
        "task %s (%s) attempt %d: lease lost %s: %s%s",
        ctx.task_id, ctx.name, ctx.attempt, state, reason, more,
    )  # fmt: skip
