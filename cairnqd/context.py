"""`TaskContext`: what a handler holds for one claimed task.

Every owned write is gated locally: once the lease is known lost (or its local
deadline has passed, see `_inflight`), or the task is settled, the context refuses to
write (`LostLease`) without a round trip. That stops a zombie handler (one abandoned
at `max_run_ms`, or whose heartbeat failed) from writing against a re-claim of the
same task by the same worker id. `succeed` and `fail` after settlement return None, so
settling twice is a no-op.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cairnqd.errors import LostLease, TaskError, exception_text
from cairnqd.models import Task, TaskDef, task_name
from cairnqd.store.arguments import require_number, require_str
from cairnqd.store.executor import UserWrite
from cairnqd.tasklog import TaskLogger
from cairnqd.tracing import traced_submit

if TYPE_CHECKING:
    from cairnqd._settlement import Settlement


class TaskContext:
    __slots__ = (
        "_cancel_seen",
        "_host",
        "_lease_lost",
        "_settled",
        "_task",
        "identity",
        "lease_deadline",
        "observer_slot",
        "observer_state",
        "released",
        "started_at",
        "trace_span",
    )

    def __init__(self, host: Settlement, task: Task) -> None:
        self._host = host
        self._task = task
        self._settled = False
        self._cancel_seen = task.cancel_requested_at_ms is not None
        self._lease_lost: asyncio.Event | None = None
        #: (task id, attempt): two attempts of one task are two contexts.
        self.identity = (task.id, task.attempt)
        #: Monotonic time the lease may end; see `_inflight`.
        self.lease_deadline = 0.0
        #: Monotonic time the handler was called; None while it waits to start.
        self.started_at: float | None = None
        #: Set once the worker let go of it and reported its end.
        self.released = False
        #: The worker's observer may keep its own bookkeeping for this attempt here
        #: (set in `tasks_held`), instead of in a table keyed by the context: an
        #: object (often shared by many tasks) and an integer (its own per attempt).
        #: Two fields rather than a tuple: nothing is allocated per task.
        self.observer_state: Any = None
        self.observer_slot = 0
        #: This attempt's OpenTelemetry process span while it runs (`cairnqd.tracing`).
        self.trace_span: Any = None

    # -- what the handler reads ----------------------------------------------------------

    @property
    def task(self) -> Task:
        return self._task

    @property
    def task_id(self) -> str:
        return self._task.id

    @property
    def name(self) -> str:
        return self._task.name

    @property
    def queue(self) -> str:
        return self._task.queue

    @property
    def attempt(self) -> int:
        return self._task.attempt

    @property
    def worker_id(self) -> str:
        return self._host.worker_id

    @property
    def payload(self) -> Any:
        return self._task.payload

    @property
    def metadata(self) -> dict[str, Any]:
        meta = self._task.metadata
        return meta if isinstance(meta, dict) else {}

    @property
    def root_id(self) -> str | None:
        return self._task.root_id

    @property
    def correlation_id(self) -> str | None:
        return self._task.correlation_id

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger (`cairnqd.task.<name>`) whose records name this task, in any thread;
        records of any logger made while the handler runs name it too."""
        return TaskLogger(logging.getLogger(f"cairnqd.task.{self._task.name}"), self)

    @property
    def settled(self) -> bool:
        return self._settled

    @property
    def cancel_seen(self) -> bool:
        """Whether this worker already knows a cancel was requested (no round trip)."""
        return self._cancel_seen

    @property
    def lease_lost(self) -> asyncio.Event:
        """Set when the lease is lost; await it to abandon work early."""
        if self._lease_lost is None:
            # Created lazily: most handlers never look, and an Event per task adds up.
            self._lease_lost = asyncio.Event()
        return self._lease_lost

    @property
    def lost_lease(self) -> bool:
        return self._lease_lost is not None and self._lease_lost.is_set()

    # -- state changes the worker makes ----------------------------------------------------

    def _mark_lost(self) -> None:
        self.lease_lost.set()

    def _mark_settled(self) -> None:
        self._settled = True

    def _mark_cancel_seen(self) -> None:
        self._cancel_seen = True

    def _check_writable(self) -> None:
        if self._settled or self.lost_lease:
            raise LostLease(self.task_id)
        if self.lease_deadline <= self._host.inflight.clock():
            self._mark_lost()
            raise LostLease(self.task_id)

    # -- owned writes ----------------------------------------------------------------------

    async def progress(self, value: float | None, message: str | None = None) -> Task:
        """Record how far the task is: `value` a fraction from 0 to 1 (None keeps the
        last one), `message` a label (None keeps the last one)."""
        if value is not None:
            # A fraction (docs/protocol.md §2.1; success writes 1.0): 2.0 or
            # -1 would show as 200% or -100% done wherever progress is displayed.
            require_number(value, "progress", minimum=0, maximum=1)
        self._check_writable()
        host = self._host
        try:
            task = await host.store.progress(
                task_id=self.task_id,
                worker_id=self.worker_id,
                progress=value,
                message=message,
                attempt=self.attempt,
            )
        except LostLease:
            self._mark_lost()
            raise
        except Exception as exc:
            host.refused(exc)  # a full disk holds the worker's claims, as for results
            raise
        host.written()
        return task

    async def heartbeat(self) -> Task:
        """Renew this task's lease now (the worker renews it on its own as well); the
        task as it then reads. The renewal is the worker's (`renew_leases`): for this
        attempt only and never earlier than the lease already runs, so one that reaches
        the database late cannot shorten the lease the worker counts on."""
        self._check_writable()
        store, inflight = self._host.store, self._host.inflight
        sent_at = inflight.clock()
        reply = await store.renew_leases(
            held=[(self.task_id, self.attempt)],
            worker_id=self.worker_id,
            lease_ms=inflight.lease_ms,
        )
        inflight.renewed((self,), sent_at, reply)  # lost when missing; cancel seen
        task = await store.get(self.task_id) if self.task_id in reply else None
        if task is None:
            self._mark_lost()
            raise LostLease(self.task_id)
        return task

    async def canceled(self) -> bool:
        """True once a cancel was requested. Free when a heartbeat already saw it."""
        if self._cancel_seen:
            return True
        current = await self._host.store.get(self.task_id)
        if current is None or current.status == "canceled" or current.cancel_requested:
            self._cancel_seen = True
        return self._cancel_seen

    async def succeed(self, result: Any = None) -> Task | None:
        """Complete the task now (a pending cancel still wins). None if already settled."""
        if self._settled:
            return None
        self._check_writable()
        return await self._host.complete_now(self, result)

    async def succeed_in(self, write: UserWrite) -> Task | None:
        """Postgres: run `write(session)` and the settlement in one transaction; the
        value `write` returns becomes the result. A lost lease rolls both back."""
        if self._settled:
            return None
        self._check_writable()
        try:
            task, _ = await self._host.store.complete_in(
                task_id=self.task_id, worker_id=self.worker_id, write=write, attempt=self.attempt
            )
        except LostLease:
            self._mark_lost()
            raise
        self._mark_settled()
        self._host.inflight.release_settled(self, task)
        return task

    async def fail(
        self,
        error: str | BaseException | Mapping[str, Any] = "task failed",
        *,
        retryable: bool = True,
    ) -> Task | None:
        """Fail this attempt. A TaskError's own retryability wins over `retryable`."""
        if self._settled:
            return None
        self._check_writable()
        envelope, retry = error_envelope(error, retryable)
        return await self._host.fail_now(self, envelope, retry)

    async def submit(
        self, name: str | TaskDef[Any, Any], payload: Any = None, **kwargs: Any
    ) -> Task:
        """Submit a child task: parent, root and correlation ids are wired from this one.

        Refused once the lease is lost: the retry of this task would submit it again.
        """
        if self.lost_lease:
            raise LostLease(self.task_id)
        kwargs.setdefault("parent_id", self.task_id)
        kwargs.setdefault("root_id", self._task.root_id or self.task_id)
        kwargs.setdefault("correlation_id", self._task.correlation_id)
        return await traced_submit(
            self._host.store.submit, name=task_name(name), payload=payload, **kwargs
        )

    async def dependencies(self) -> list[Task]:
        """The tasks this one was submitted `after`, as they are now (results
        included), in the order named; a parent purged since is left out."""
        return await self._host.store.dependencies(self.task_id)

    async def wait(self, task_id: str, *, timeout_ms: int = 30_000, poll_ms: int = 100) -> Task:
        from cairnqd.client import wait_for_task

        require_str(task_id, "task_id")
        return await wait_for_task(
            self._host.store, task_id, None, timeout_ms=timeout_ms, poll_ms=poll_ms,
            max_poll_ms=500,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"TaskContext({self.task_id}, name={self.name!r}, attempt={self.attempt})"


def error_envelope(
    error: str | BaseException | Mapping[str, Any], retryable: bool
) -> tuple[dict[str, Any], bool]:
    """The stored envelope for `ctx.fail(...)`, and whether the failure may retry."""
    if isinstance(error, TaskError):
        return error.envelope(), error.retryable
    if isinstance(error, BaseException):
        return (
            {
                "type": type(error).__name__,
                "code": "handler_error",
                # Never raising: the exception's own __str__ is the handler's code.
                "message": exception_text(error),
                "retryable": retryable,
                "details": {},
            },
            retryable,
        )
    if isinstance(error, Mapping):
        # An envelope the caller built is stored as given.
        return dict(error), retryable
    return TaskError(str(error), retryable=retryable).envelope(), retryable
