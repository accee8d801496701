"""One handler call, from its start to the settlement of every task it held.

Design notes.

- This is the per-task path, tuned: an async handler without `max_run_ms` is awaited
  directly by `execute` (no extra coroutine layer), and a returned result is queued on
  the worker's `CompleteBatcher`, which frees the call slot at once.
- Whatever the handler leaves unsettled is settled here: a returned value completes
  it, a raised error fails it (a `TaskError` carries its own envelope and
  retryability), a `LostLease` settles nothing, and a call past `max_run_ms` is
  abandoned and failed as `handler_timeout`.
- Failures are written one task at a time, straight to the store, with capped
  exponential backoff. `TaskContext` and the batcher settle through the same methods.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cairnqd._handlers import RegisteredHandler
from cairnqd._jsoncodec import dump_json
from cairnqd.errors import LostLease, SerializationError, TaskError
from cairnqd.models import Task

if TYPE_CHECKING:
    from cairnqd.context import TaskContext
    from cairnqd.worker import Worker


@dataclass(eq=False)
class Call:
    handler: RegisteredHandler
    contexts: list[TaskContext]
    started: float = field(default_factory=time.monotonic)


def backoff_delay_ms(attempt: int, base_ms: int, max_ms: int, rand: float | None = None) -> int:
    """Capped exponential backoff with equal jitter: uniform in [w/2, w), so a fleet
    retrying at the cap stops moving in lockstep."""
    if base_ms <= 0:
        return 0
    window: int = min(max_ms, base_ms * 2 ** max(0, attempt - 1))
    half = window // 2
    r = random.random() if rand is None else rand
    return half + int(r * (window - half))


class CallRunner:
    """Runs a worker's handler calls and settles what they leave."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        # The worker's own tables, held directly: `execute` touches them on every task.
        self._contexts = worker._contexts
        self._in_use = worker._in_use
        self._prefetch = worker._prefetch
        self._settler = worker._settler
        # Plain calls in flight, for auto prefetch's "is anything running slow?".
        self._plain_calls: set[Call] = set()

    def longest_plain_call(self) -> float:
        """Seconds the oldest plain call in flight has been running (0 when none)."""
        if not self._plain_calls:
            return 0.0
        return time.monotonic() - min(c.started for c in self._plain_calls)

    async def execute(self, call: Call) -> None:
        handler, contexts = call.handler, call.contexts
        plain = handler.batch is None and handler.resource is None
        if plain:
            call.started = time.monotonic()  # the handler's own time, not the queueing
            self._plain_calls.add(call)
        try:
            error: BaseException | None = None
            try:
                value = await self._invoke(handler, contexts)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                value, error = None, exc
            self._call_ended(call, plain)
            if error is None:
                await self._settle_value(handler, contexts, value)
            elif isinstance(error, _MaxRunExceeded):
                await self._settle_timeout(call)
            else:
                await self._settle_error(contexts, error)
        finally:
            self._worker.handled += len(contexts)
            self._plain_calls.discard(call)
            if handler.resource is not None:
                self._in_use[handler.resource] -= 1
            for ctx in contexts:
                # A result still queued for writing keeps its lease renewed until then.
                if ctx.settled or ctx.lost_lease:
                    self._contexts.pop(ctx.task_id, None)

    def _call_ended(self, call: Call, plain: bool) -> None:
        """The handler returned or raised: feed its run time to auto prefetch (the
        settlement that follows is the database's pace, not the handler's)."""
        if plain:
            self._plain_calls.discard(call)
            self._prefetch.observe(time.monotonic() - call.started)

    async def _invoke(self, handler: RegisteredHandler, contexts: list[TaskContext]) -> Any:
        if handler.batch is not None:
            args: tuple[Any, ...] = (contexts,)
        elif handler.wants_payload:
            args = (contexts[0], contexts[0].payload)
        else:
            args = (contexts[0],)
        max_run_ms = self._worker.max_run_ms
        if max_run_ms is None:
            if handler.is_async:  # the hot path: no extra coroutine layer
                value = await handler.fn(*args)
                if value is not None and inspect.isawaitable(value):
                    value = await value
                return value
            return await self._call_handler(handler, args)
        # max_run_ms bounds the whole call, an awaitable a sync handler returns included.
        running = asyncio.ensure_future(self._call_handler(handler, args))
        done, _ = await asyncio.wait({running}, timeout=max_run_ms / 1000)
        if not done:
            # Flag lease-lost first, so the abandoned handler cannot write any more.
            for ctx in contexts:
                ctx._mark_lost()
            running.cancel()
            running.add_done_callback(_consume_outcome)
            raise _MaxRunExceeded
        return running.result()

    async def _call_handler(self, handler: RegisteredHandler, args: tuple[Any, ...]) -> Any:
        if handler.is_async:
            value = await handler.fn(*args)
        else:
            loop = asyncio.get_running_loop()
            value = await loop.run_in_executor(self._worker._executor, lambda: handler.fn(*args))
        if value is not None and inspect.isawaitable(value):
            value = await value
        return value

    # -- what the call left unsettled ----------------------------------------------------

    async def _settle_value(
        self, handler: RegisteredHandler, contexts: list[TaskContext], value: Any
    ) -> None:
        pending = [c for c in contexts if not c.settled and not c.lost_lease]
        results: Mapping[str, Any] | None = None
        if handler.batch is not None and isinstance(value, Mapping):
            results = value
        for ctx in pending:
            result = (
                results.get(ctx.task_id)
                if results is not None
                else value
                if not handler.batch
                else None
            )
            try:
                encoded = None if result is None else dump_json(result, what="result")
            except SerializationError as exc:
                envelope = _envelope("SerializationError", "unserializable_result", str(exc))
                await self.settle_quietly(self.settle_fail(ctx, envelope, False), ctx)
                continue
            self._settler.enqueue(ctx, encoded)
        if self._settler.backlogged():
            await self._settler.backpressure()

    async def _settle_error(self, contexts: list[TaskContext], exc: BaseException) -> None:
        if isinstance(exc, LostLease):
            return
        if isinstance(exc, TaskError):
            envelope, retryable = exc.envelope(), exc.retryable
        else:
            envelope = _envelope(type(exc).__name__, "handler_error", str(exc), retryable=True)
            retryable = True
        for ctx in contexts:
            if not ctx.settled and not ctx.lost_lease:
                await self.settle_quietly(self.settle_fail(ctx, envelope, retryable), ctx)

    async def _settle_timeout(self, call: Call) -> None:
        message = f"handler ran longer than max_run_ms={self._worker.max_run_ms}"
        envelope = _envelope("HandlerTimeout", "handler_timeout", message, retryable=True)
        for ctx in call.contexts:
            if not ctx.settled:
                # Straight to the store: the context is already flagged lost.
                await self.settle_quietly(self.settle_fail(ctx, envelope, True, force=True), ctx)

    async def fail_no_handler(self, ctx: TaskContext) -> None:
        envelope = _envelope("NoHandler", "no_handler", f"no handler registered for {ctx.name!r}")
        try:
            await self.settle_quietly(self.settle_fail(ctx, envelope, False), ctx)
        finally:
            self._contexts.pop(ctx.task_id, None)

    async def settle_quietly(self, settle: Awaitable[Any], ctx: TaskContext) -> None:
        try:
            await settle
        except LostLease:
            ctx._mark_lost()
        except Exception as exc:
            self._worker._report(exc, {"phase": "execute", "task_id": ctx.task_id})
            # Unwritten: stop renewing the lease so recovery hands the task on,
            # rather than the heartbeat keeping it ours forever.
            self._worker._forget(ctx)

    # -- settlement (used by TaskContext and the batcher too) ----------------------------

    async def settle_complete(self, ctx: TaskContext, result: Any) -> Task | None:
        worker = self._worker
        try:
            task = await worker.store.complete(
                task_id=ctx.task_id, worker_id=worker.worker_id, result=result
            )
        except LostLease:
            ctx._mark_lost()
            raise
        ctx._mark_settled()
        self.report_end(ctx, task)
        return task

    async def settle_fail(
        self, ctx: TaskContext, envelope: dict[str, Any], retryable: bool, *, force: bool = False
    ) -> Task | None:
        worker = self._worker
        delay = (
            backoff_delay_ms(ctx.attempt, worker.retry_backoff_ms, worker.retry_backoff_max_ms)
            if retryable
            else 0
        )
        try:
            task = await worker.store.fail(
                task_id=ctx.task_id,
                worker_id=worker.worker_id,
                error=envelope,
                retryable=retryable,
                delay_ms=delay,
            )
        except LostLease:
            ctx._mark_lost()
            raise
        ctx._mark_settled()
        self.report_end(ctx, task, reason=str(envelope.get("code", "")))
        return task

    def report_end(self, ctx: TaskContext, task: Task | None, reason: str = "") -> None:
        observer = self._worker.observer
        if observer is None:
            return
        status = task.status if task is not None else "lease_lost"
        outcome = "retried" if status == "queued" else status
        duration = time.time() - (
            ctx.task.updated_at_ms / 1000 if ctx.task.updated_at_ms else time.time()
        )
        observer.task_ended(ctx.task, outcome, reason, max(0.0, duration))


def _envelope(type_: str, code: str, message: str, *, retryable: bool = False) -> dict[str, Any]:
    return {"type": type_, "code": code, "message": message, "retryable": retryable, "details": {}}


class _MaxRunExceeded(Exception):
    pass


def _consume_outcome(task: asyncio.Future[Any]) -> None:
    """An abandoned handler may still fail later; read its outcome so asyncio does not
    log 'exception was never retrieved' for a result nobody can use."""
    if not task.cancelled():
        task.exception()
