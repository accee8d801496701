"""The database side of the worker's stateful lease models (`test_inflight_model.py`,
`test_lease_guard_model.py`): the lease columns of each task, requests that travel to
the database and back, and the protocol's rules for claims, heartbeats, completions and
recovery, on one simulated clock (`now`, in seconds)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cairnqd._inflight import InFlight
from cairnqd.context import TaskContext
from cairnqd.models import Task

LEASE_S = 3.0
TASKS = ["t1", "t2"]
WORKERS = ["w1", "w2"]


@dataclass
class Row:
    """The lease columns of one task, as the database holds them."""

    status: str = "queued"
    worker: str | None = None
    attempt: int = 0
    lease_until: float = 0.0


class Host:
    """What a TaskContext needs of its worker, for contexts that never write."""

    def __init__(self, inflight: InFlight) -> None:
        self.inflight = inflight


def running_task(task_id: str, attempt: int) -> Task:
    return Task(
        id=task_id, name="n", queue="q", status="running", payload={}, attempt=attempt,
        max_attempts=1000, run_at_ms=0, created_at_ms=0, updated_at_ms=0,
    )  # fmt: skip


def model_inflight(name: str, clock: Any) -> InFlight:
    """A worker's real in-flight table on the model's clock."""
    inflight = InFlight(int(LEASE_S * 1000), lambda exc, info: None, name)
    inflight.clock = clock
    return inflight


@dataclass
class Message:
    """A request on its way: sent by a worker at `sent_at`, applied by the database
    when it is delivered, answered later (if the worker still exists)."""

    kind: str  # claim, heartbeat or complete
    worker: str
    incarnation: int
    sent_at: float
    task_id: str = ""
    contexts: list[TaskContext] = field(default_factory=list)
    reply: Any = None
    delivered: bool = False


class LeaseDatabase:
    """The database's rules for the requests of the models' workers."""

    def __init__(self) -> None:
        self.now = 0.0
        self.db = {t: Row() for t in TASKS}

    def owned(self, row: Row, worker: str, clock: float | None = None) -> bool:
        now = self.now if clock is None else clock
        return row.status == "running" and row.worker == worker and row.lease_until > now

    def recover_expired(self) -> None:
        for row in self.db.values():
            if row.status == "running" and row.lease_until <= self.now:
                row.status, row.worker = "queued", None

    def apply_request(self, m: Message) -> None:
        """Apply a delivered request; its reply waits on the message."""
        m.delivered = True
        if m.kind == "claim":
            row = self.db[m.task_id]
            if row.status != "queued":
                return
            row.status, row.worker, row.attempt = "running", m.worker, row.attempt + 1
            row.lease_until = self.now + LEASE_S
            m.reply = row.attempt
        elif m.kind == "heartbeat":
            # `renew_leases`. Its clock is the server's transaction start (`now()`),
            # read when the statement arrived: before any wait for a lock, so possibly
            # long before it is applied. The earliest it can be is when it was sent.
            clock = m.sent_at
            reply: dict[str, tuple[int, bool]] = {}
            for ctx in m.contexts:
                row = self.db[ctx.task_id]
                if self.owned(row, m.worker, clock) and row.attempt == ctx.attempt:
                    row.lease_until = max(row.lease_until, clock + LEASE_S)
                    reply[ctx.task_id] = (row.attempt, False)
            m.reply = reply
        else:  # complete
            ctx = m.contexts[0]
            row = self.db[ctx.task_id]
            done = self.owned(row, m.worker) and row.attempt == ctx.attempt
            if done:
                self.db[ctx.task_id] = Row(attempt=row.attempt)  # finished; submitted anew
            m.reply = done

    def answer_to(self, m: Message, inflight: InFlight) -> None:
        """The worker reads the reply to `m`."""
        if m.kind == "claim" and m.reply is not None:
            ctx = TaskContext(Host(inflight), running_task(m.task_id, m.reply))  # type: ignore[arg-type]
            inflight.hold((ctx,), m.sent_at)
            inflight.backlog.append(ctx)
        elif m.kind == "heartbeat":
            inflight.renewed(m.contexts, m.sent_at, m.reply)
        elif m.kind == "complete":
            inflight.release(m.contexts[0], "succeeded" if m.reply else "lease_lost")
