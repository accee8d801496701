"""A stateful property test of the lease guard: no two executions of a task overlap.

`test_inflight_model.py` checks the bookkeeping: no two places hold a *live* lease on
one task. This model checks what a user sees: a handler's code running. An execution
begins when a worker starts a task and ends only when the handler returns, when the
guard's cancel reaches it, or when its process dies; a lease lost on paper does not end
it. Two real workers (`InFlight` and `LeaseGuard` as the worker builds them) run against
a model of the database's lease rules on one simulated clock, and Hypothesis interleaves:

- requests (claims, heartbeats, results) that reach the database late, in any order,
  or never, so renewals fail and stall for any length of time, far past the lease;
- recovery of expired leases at any moment, and claims of the recovered task by either
  worker;
- handlers that stop when cancelled and handlers that do not (a sync handler's thread),
  handlers that return, and crashes.

Time moves in steps no longer than the guard's tick, which is what the worker's event
loop gives it (a loop blocked by a handler is the daemon parent's to catch, tested in
tests/daemon/test_fault_paths.py). When the guard reports a
handler that did not stop, the model does what the daemon's child does: the process
exits, and everything it ran ends.

The invariant, checked after every step and at every tick: at each moment, at most one
execution per task. It rests on the assumption docs/architecture.md states: the
database's clock and the worker's run at the same rate (here: one clock).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cairnqd._calls import Call
from cairnqd._handlers import RegisteredHandler
from cairnqd._inflight import InFlight
from cairnqd._leaseguard import LeaseGuard
from cairnqd.context import TaskContext
from tests.support.models import examples
from tests.worker.lease_db_model import (
    TASKS,
    WORKERS,
    LeaseDatabase,
    Message,
    model_inflight,
)

HANDLER = RegisteredHandler("n", lambda ctx: None, None, None, True, False)


class _Runner:
    """What the guard reads of a `CallRunner`: the calls whose handler may run."""

    def __init__(self) -> None:
        self.active: set[Call] = set()


@dataclass(eq=False)
class Execution:
    """A handler's code running: `body` is pending while it runs and can be cancelled,
    or is marked running (a thread, or a handler that ignores the cancel) and cannot."""

    task_id: str
    attempt: int
    worker: str
    call: Call
    body: concurrent.futures.Future[None]

    @property
    def alive(self) -> bool:
        return not self.body.done()

    def end(self) -> None:
        if not self.body.done():
            self.body.set_result(None)


@dataclass
class SimWorker:
    name: str
    model: LeaseGuardModel
    inflight: InFlight = field(init=False)
    runner: _Runner = field(init=False)
    guard: LeaseGuard = field(init=False)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.inflight = model_inflight(self.name, lambda: self.model.now)
        self.runner = _Runner()
        self.guard = LeaseGuard(self.inflight, self.runner)  # type: ignore[arg-type]
        self.guard.on_overrun = self._overrun

    def _overrun(self, contexts: Sequence[TaskContext]) -> None:
        # The daemon's child exits here, before the lease ends.
        self.model.crash(self.name)


class LeaseGuardModel(RuleBasedStateMachine, LeaseDatabase):
    def __init__(self) -> None:
        RuleBasedStateMachine.__init__(self)
        LeaseDatabase.__init__(self)
        self.workers = {w: SimWorker(w, self) for w in WORKERS}
        self.incarnation = dict.fromkeys(WORKERS, 0)
        self.wire: list[Message] = []
        self.executions: list[Execution] = []

    # -- time, with the guard ticking as the event loop lets it ---------------------------

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.0, 2.0, 4.0]))
    def time_passes(self, seconds: float) -> None:
        tick = self.workers[WORKERS[0]].guard.tick_s
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + tick)
            for worker in list(self.workers.values()):
                worker.guard.check()
            self.at_most_one_execution_per_task()

    @rule()
    def recover_expired_leases(self) -> None:
        self.recover_expired()

    # -- what a worker does ----------------------------------------------------------------

    def _send(self, kind: str, w: str, **fields: object) -> Message:
        message = Message(kind, w, self.incarnation[w], self.now, **fields)  # type: ignore[arg-type]
        self.wire.append(message)
        return message

    @rule(w=st.sampled_from(WORKERS), t=st.sampled_from(TASKS))
    def send_claim(self, w: str, t: str) -> None:
        self._send("claim", w, task_id=t)

    @rule(w=st.sampled_from(WORKERS))
    def send_heartbeat(self, w: str) -> None:
        live = self.workers[w].inflight.renewable()
        if live:
            self._send("heartbeat", w, contexts=live)

    @rule(w=st.sampled_from(WORKERS), stubborn=st.booleans())
    def start_next(self, w: str, stubborn: bool) -> None:
        worker = self.workers[w]
        inflight = worker.inflight
        if not inflight.backlog:
            return
        ctx = inflight.backlog.popleft()
        if not inflight.begin(ctx):
            return
        body: concurrent.futures.Future[None] = concurrent.futures.Future()
        if stubborn:
            body.set_running_or_notify_cancel()  # a thread: cancel() no longer stops it
        call = Call(HANDLER, [ctx], body=body)
        worker.runner.active.add(call)
        self.executions.append(Execution(ctx.task_id, ctx.attempt, w, call, body))

    @rule(w=st.sampled_from(WORKERS))
    def handler_returns(self, w: str) -> None:
        """The oldest running execution of `w` returns; its result is sent only while
        the worker still holds the lease by its own clock (`Settlement`)."""
        worker = self.workers[w]
        running = [e for e in self.executions if e.worker == w and e.alive]
        if not running:
            return
        execution = running[0]
        execution.end()
        call = execution.call
        call.handler_done = True
        worker.runner.active.discard(call)
        ctx = call.contexts[0]
        if ctx.released:
            return
        if ctx.lost_lease or ctx.lease_deadline <= self.now:
            ctx._mark_lost()
            worker.inflight.release(ctx, "lease_lost", "model: result not written")
            return
        ctx._mark_settled()
        self._send("complete", w, contexts=[ctx])

    @rule(w=st.sampled_from(WORKERS))
    def crash(self, w: str) -> None:
        """The process dies: every execution in it ends, its requests are orphaned."""
        for execution in self.executions:
            if execution.worker == w:
                execution.end()
        self.incarnation[w] += 1
        self.workers[w].reset()

    # -- the database applies a request late; the answer comes back later, or never ------

    @rule(i=st.integers(min_value=0, max_value=3))
    def deliver(self, i: int) -> None:
        waiting = [m for m in self.wire if not m.delivered]
        if waiting:
            self.apply_request(waiting[min(i, len(waiting) - 1)])

    @rule(i=st.integers(min_value=0, max_value=3), lost=st.sampled_from([False, False, True]))
    def answer(self, i: int, lost: bool) -> None:
        delivered = [m for m in self.wire if m.delivered]
        if not delivered:
            return
        self._answer(delivered[min(i, len(delivered) - 1)], lost)

    def _answer(self, m: Message, lost: bool) -> None:
        self.wire.remove(m)
        if lost or m.incarnation != self.incarnation[m.worker]:
            return
        self.answer_to(m, self.workers[m.worker].inflight)

    # The common case, a request answered at once, as one step each, so the search
    # spends its steps on the interleavings around them rather than on assembling them.

    @rule(w=st.sampled_from(WORKERS), t=st.sampled_from(TASKS), stubborn=st.booleans())
    def claim_and_start(self, w: str, t: str, stubborn: bool) -> None:
        message = self._send("claim", w, task_id=t)
        self._round_trip(message)
        self.start_next(w, stubborn)

    @rule(w=st.sampled_from(WORKERS))
    def heartbeat_round_trip(self, w: str) -> None:
        live = self.workers[w].inflight.renewable()
        if live:
            self._round_trip(self._send("heartbeat", w, contexts=live))

    def _round_trip(self, message: Message) -> None:
        self.apply_request(message)
        self._answer(message, False)

    # -- the invariant -------------------------------------------------------------------

    @invariant()
    def at_most_one_execution_per_task(self) -> None:
        alive: dict[str, list[Execution]] = {}
        for execution in self.executions:
            if execution.alive:
                alive.setdefault(execution.task_id, []).append(execution)
        for task_id, running in alive.items():
            where = [(e.worker, e.attempt) for e in running]
            assert len(running) <= 1, f"{task_id} executing twice at {self.now}: {where}"


LeaseGuardModel.TestCase.settings = settings(
    max_examples=examples(300), stateful_step_count=60, deadline=None
)
TestLeaseGuardModel = LeaseGuardModel.TestCase


def test_the_guard_stops_a_handler_whose_renewals_stall_before_recovery_can_run_it() -> None:
    """The failure this guards against, assembled by hand: a claimed task runs, every
    heartbeat stalls on the wire, the lease ends and the other worker claims the task.
    Without the guard, both executions run at once."""
    model = LeaseGuardModel()
    model.send_claim("w1", "t1")
    model.deliver(0)
    model.answer(0, False)
    model.start_next("w1", stubborn=False)
    model.send_heartbeat("w1")  # stalls: never delivered
    model.time_passes(4.0)
    first = model.executions[0]
    assert not first.alive and first.call.lease_stop
    model.recover_expired_leases()
    model.send_claim("w2", "t1")
    model.deliver(1)
    model.answer(0, False)
    model.start_next("w2", stubborn=False)
    assert [e.worker for e in model.executions if e.alive] == ["w2"]


def test_a_handler_that_does_not_stop_ends_its_process_before_the_lease() -> None:
    model = LeaseGuardModel()
    model.send_claim("w1", "t1")
    model.deliver(0)
    model.answer(0, False)
    model.start_next("w1", stubborn=True)
    deadline = model.workers["w1"].inflight.contexts()[0].lease_deadline
    ended_at: list[float] = []
    while model.executions[0].alive:
        model.time_passes(0.1)
        ended_at.append(model.now)
    assert ended_at[-1] < deadline
    assert model.incarnation["w1"] == 1  # the process was replaced
