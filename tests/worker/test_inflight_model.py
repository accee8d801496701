"""A stateful property test of the worker's lease bookkeeping (`cairnqd._inflight`).

Two workers' real `InFlight` tables run against a small model of the database's lease
rules (claim, renew_leases, recovery, complete_many with its attempt check), on one
simulated clock. Hypothesis interleaves claims, starts, heartbeats that succeed, fail
or arrive late, time passing, lease recovery, finishes and crashes. Two invariants:

- no task is ever executing in two places with a live lease on both (a context counts
  as live while the worker would still let it write: not lost, local deadline ahead);
- no handler starts on an expired lease.

Requests travel: a worker sends one (a claim, a heartbeat, a result), the database
applies it some time later, and the answer reaches the worker later still, or never
(lost, or the worker crashed meanwhile). Hypothesis picks every interleaving of those
steps with the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cairnqd._inflight import InFlight
from tests.support.models import examples
from tests.worker.lease_db_model import (
    LEASE_S,
    TASKS,
    WORKERS,
    LeaseDatabase,
    Message,
    model_inflight,
)


@dataclass
class SimWorker:
    name: str
    clock: Any
    inflight: InFlight = field(init=False)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.inflight = model_inflight(self.name, self.clock)


class LeaseModel(RuleBasedStateMachine, LeaseDatabase):
    def __init__(self) -> None:
        RuleBasedStateMachine.__init__(self)
        LeaseDatabase.__init__(self)
        self.workers = {w: SimWorker(w, lambda: self.now) for w in WORKERS}
        self.incarnation = dict.fromkeys(WORKERS, 0)
        self.wire: list[Message] = []

    # -- time and the database's own duties --------------------------------------------

    @rule(seconds=st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.5]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def recover_expired_leases(self) -> None:
        self.recover_expired()

    # -- a worker sends ------------------------------------------------------------------

    def _send(self, kind: str, w: str, **fields: Any) -> None:
        self.wire.append(Message(kind, w, self.incarnation[w], self.now, **fields))

    @rule(w=st.sampled_from(WORKERS), t=st.sampled_from(TASKS))
    def send_claim(self, w: str, t: str) -> None:
        self._send("claim", w, task_id=t)

    @rule(w=st.sampled_from(WORKERS))
    def send_heartbeat(self, w: str) -> None:
        live = self.workers[w].inflight.renewable()
        if live:
            self._send("heartbeat", w, contexts=live)

    @rule(w=st.sampled_from(WORKERS))
    def handler_returns(self, w: str) -> None:
        """The oldest running call returns; its result goes out only while the
        worker still holds the lease by its own clock (`Settlement._writable`)."""
        inflight = self.workers[w].inflight
        running = [c for c in inflight.contexts() if c.started_at is not None and not c.settled]
        if not running:
            return
        ctx = running[0]
        if ctx.lost_lease or ctx.lease_deadline <= self.now:
            ctx._mark_lost()
            inflight.release(ctx, "lease_lost", "model: result not written")
            return
        ctx._mark_settled()  # queued for writing; the heartbeat no longer renews it
        self._send("complete", w, contexts=[ctx])

    @rule(w=st.sampled_from(WORKERS))
    def start_next(self, w: str) -> None:
        inflight = self.workers[w].inflight
        if not inflight.backlog:
            return
        ctx = inflight.backlog.popleft()
        if inflight.begin(ctx):
            assert ctx.lease_deadline > self.now, "a handler started on an expired lease"

    @rule(w=st.sampled_from(WORKERS))
    def crash(self, w: str) -> None:
        self.incarnation[w] += 1
        self.workers[w].reset()

    # -- the database applies a request, the worker reads the answer ---------------------

    @rule(i=st.integers(min_value=0, max_value=2))
    def deliver(self, i: int) -> None:
        waiting = [m for m in self.wire if not m.delivered]
        if not waiting:
            return
        self.apply_request(waiting[min(i, len(waiting) - 1)])

    @rule(i=st.integers(min_value=0, max_value=2), lost=st.sampled_from([False, False, True]))
    def answer(self, i: int, lost: bool) -> None:
        delivered = [m for m in self.wire if m.delivered]
        if not delivered:
            return
        self._answer(delivered[min(i, len(delivered) - 1)], lost)

    # The common case, a request answered promptly, as one step each, so the search
    # spends its steps on the interleavings around them rather than on assembling them.

    @rule(w=st.sampled_from(WORKERS), t=st.sampled_from(TASKS))
    def claim_round_trip(self, w: str, t: str) -> None:
        self.send_claim(w, t)
        self._round_trip(self.wire[-1], 0.0)

    @rule(w=st.sampled_from(WORKERS), lag=st.sampled_from([0.0, 0.5, 1.0]))
    def heartbeat_round_trip(self, w: str, lag: float) -> None:
        before = len(self.wire)
        self.send_heartbeat(w)
        if len(self.wire) > before:
            self._round_trip(self.wire[-1], lag)

    def _round_trip(self, m: Message, lag: float) -> None:
        self.now += lag / 2
        self.apply_request(m)
        self.now += lag / 2
        self._answer(m, False)

    def _answer(self, m: Message, lost: bool) -> None:
        self.wire.remove(m)
        if lost or m.incarnation != self.incarnation[m.worker]:
            return  # the answer never arrives, or its worker is gone
        self.answer_to(m, self.workers[m.worker].inflight)

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def never_two_live_executions(self) -> None:
        live: dict[str, list[tuple[str, int]]] = {}
        for name, worker in self.workers.items():
            for ctx in worker.inflight.contexts():
                executing = ctx.started_at is not None and not ctx.settled
                if not executing or ctx.lost_lease or ctx.lease_deadline <= self.now:
                    continue
                live.setdefault(ctx.task_id, []).append((name, ctx.attempt))
        for task_id, places in live.items():
            assert len(places) <= 1, f"{task_id} executing with live leases in {places}"

    @invariant()
    def a_live_context_owns_its_row(self) -> None:
        for name, worker in self.workers.items():
            for ctx in worker.inflight.contexts():
                if ctx.settled or ctx.lost_lease or ctx.lease_deadline <= self.now:
                    continue
                row = self.db[ctx.task_id]
                assert row.worker == name and row.attempt == ctx.attempt, (ctx, row)
                assert row.lease_until >= ctx.lease_deadline


LeaseModel.TestCase.settings = settings(
    max_examples=examples(500), stateful_step_count=60, deadline=None
)
TestLeaseModel = LeaseModel.TestCase


def test_a_late_heartbeat_reply_renews_only_the_attempt_that_holds_the_row() -> None:
    """The race the random search rarely assembles: a beat for attempt 1 is on the wire
    while its lease lapses, recovery requeues the task, the same worker claims it again
    as attempt 2, and only then does the beat reach the database and renew the row.
    The reply must not bring attempt 1 back to life."""
    model = LeaseModel()
    model.claim_round_trip("w1", "t1")
    model.start_next("w1")
    model.time_passes(2.5)
    model.send_heartbeat("w1")
    model.time_passes(1.0)
    model.recover_expired_leases()
    model.claim_round_trip("w1", "t1")
    model.start_next("w1")
    model.deliver(0)
    model.answer(0, False)
    model.a_live_context_owns_its_row()
    model.never_two_live_executions()
    first, second = model.workers["w1"].inflight.contexts()
    assert (first.attempt, first.lost_lease) == (1, True)
    assert (second.attempt, second.lost_lease) == (2, False)


def test_a_renewal_applied_after_a_later_one_does_not_shorten_the_lease() -> None:
    """Two renewals of one attempt on the wire (a beat, and a late claim's confirming
    renewal), the later one applied first. The earlier one's clock is its send time:
    applied last, it must not bring the lease back before the end the worker counts on."""
    model = LeaseModel()
    model.claim_round_trip("w1", "t1")
    model.start_next("w1")
    model.send_heartbeat("w1")  # stalls behind a lock
    model.time_passes(1.0)
    model.heartbeat_round_trip("w1", 0.0)
    model.deliver(0)  # the stalled one, at last
    model.answer(0, False)
    model.a_live_context_owns_its_row()
    (ctx,) = model.workers["w1"].inflight.contexts()
    assert model.db["t1"].lease_until == ctx.lease_deadline == 1.0 + LEASE_S
