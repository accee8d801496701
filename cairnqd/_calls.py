"""One handler call, from its start to the settlement of every task it held.

A call starts only the tasks whose lease is still ours; whatever the handler leaves
unsettled is settled here (returned: completed; raised, `CancelledError` included:
failed; `LostLease`: nothing; past `max_run_ms`: `handler_timeout`; stopped by the cancel
watch: completed, which a pending cancel turns into canceled). `active` keeps a
call while a handler it gave up on still runs. Why: docs/architecture.md, "Handler calls".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cairnqd._failures import FailureLog, format_traceback
from cairnqd._handlers import RegisteredHandler
from cairnqd._inflight import InFlight
from cairnqd._jsoncodec import dump_json
from cairnqd._prefetch import PrefetchSizer
from cairnqd._settlement import Settlement, envelope
from cairnqd.errors import LostLease, SerializationError, TaskError
from cairnqd.tasklog import CURRENT
from cairnqd.tracing import Consumer, record_failure

if TYPE_CHECKING:
    from cairnqd.context import TaskContext


@dataclass(eq=False)
class Call:
    handler: RegisteredHandler
    contexts: list[TaskContext]
    started: float = field(default_factory=time.monotonic)
    #: The asyncio task that runs `CallRunner.execute` for this call.
    task: asyncio.Task[Any] | None = None
    #: Where the handler's code runs when that is not `task` itself: a sync handler's
    #: thread, or the task a `max_run_ms` bound waits on.
    body: concurrent.futures.Future[Any] | asyncio.Future[Any] | None = None
    #: The handler returned or raised; what follows is settlement.
    handler_done: bool = False
    #: The lease guard cancelled the call (its leases could not be renewed), and
    #: reports it at `abort_at` if the handler is still running then.
    lease_stop: bool = False
    abort_at: float = 0.0
    overrun_reported: bool = False
    #: Monotonic time every task of the call was seen cancel-requested (`_cancels`).
    cancel_seen_at: float | None = None
    #: The cancel watch stopped the handler at `cancel_stop_at` (an async one got its
    #: task cancelled): its `CancelledError` ends the tasks canceled, not failed.
    cancel_stop: bool = False
    cancel_stop_at: float = 0.0
    cancel_overrun_reported: bool = False

    def handler_running(self) -> bool:
        """Whether the handler's code may still be executing."""
        body = self.body
        if body is not None and not body.done():
            return True
        if self.handler_done:
            return False
        return self.task is not None and not self.task.done()

    def cancel(self) -> None:
        """Cancel the handler: the call's task and, where the handler runs apart from
        it, that too (a thread cannot be cancelled once it started)."""
        if self.task is not None:
            self.task.cancel()
        if self.body is not None:
            self.body.cancel()


class CallRunner:
    """Runs a worker's handler calls and settles what they leave."""

    def __init__(
        self,
        inflight: InFlight,
        settlement: Settlement,
        prefetch: PrefetchSizer,
        *,
        max_run_ms: int | None,
        executor: Callable[[], Executor | None],
    ) -> None:
        self._inflight = inflight
        self._settlement = settlement
        self._prefetch = prefetch
        self._max_run_ms = max_run_ms
        self._executor = executor
        # Plain calls in flight, for auto prefetch's "is anything running slow?".
        self._plain_calls: set[Call] = set()
        #: Every call whose handler may still run (see the design notes).
        self.active: set[Call] = set()
        self._failures = FailureLog()
        #: Process spans, set when the worker starts with a tracer provider in place.
        self.tracer: Consumer | None = None

    def longest_plain_call(self) -> float:
        """Seconds the oldest plain call in flight has been running (0 when none)."""
        if not self._plain_calls:
            return 0.0
        return time.monotonic() - min(c.started for c in self._plain_calls)

    async def execute(self, call: Call) -> None:
        handler = call.handler
        inflight = self._inflight
        call.contexts = [ctx for ctx in call.contexts if inflight.begin(ctx)]
        contexts = call.contexts
        if not contexts:
            if handler.resource is not None:
                inflight.in_use[handler.resource] -= 1
            return
        plain = handler.batch is None and handler.resource is None
        if plain:
            call.started = time.monotonic()  # the handler's own time, not the queueing
            self._plain_calls.add(call)
        call.task = me = asyncio.current_task()
        self.active.add(call)
        tracer = self.tracer
        span_token = tracer.start(contexts) if tracer is not None else None
        # A batch call holds many tasks: its records name none of them.
        log_token = CURRENT.set(contexts[0] if len(contexts) == 1 else None)
        try:
            error: BaseException | None = None
            canceled = False
            try:
                value = await self._invoke(handler, contexts, call)
            except KeyboardInterrupt:
                # A second Ctrl-C lands in whatever frame runs, often a handler's: it
                # stops the process, and the task is left to its lease, not failed.
                raise
            except asyncio.CancelledError as exc:
                if call.lease_stop:
                    # The lease guard's: its tasks are lease-lost, so nothing settles.
                    if me is not None and me.cancelling():
                        me.uncancel()
                elif call.cancel_stop and me is not None and me.cancelling():
                    # The cancel watch's, told apart from a handler's own CancelledError
                    # by the request the task carries; one from outside the worker too
                    # leaves a request behind, and wins.
                    if me.uncancel() > 0:
                        raise
                    canceled = True
                elif me is not None and me.cancelling():
                    raise  # the call itself was cancelled from outside the worker
                value, error = None, exc
            except BaseException as exc:
                value, error = None, exc
            if call.cancel_stop and me is not None and me.cancelling() and not canceled:
                me.uncancel()  # the handler swallowed the cancel watch's request
            if canceled:
                await _until_stopped(call)
                value, error = None, None
            call.handler_done = True
            self._call_ended(call, plain)
            if error is None:
                await self._settle_value(handler, contexts, value)
            elif isinstance(error, _MaxRunExceeded):
                await self._settle_timeout(contexts)
            else:
                await self._settle_error(contexts, error)
        finally:
            call.handler_done = True
            self._retire(call)
            inflight.handled += len(contexts)
            self._plain_calls.discard(call)
            if handler.resource is not None:
                inflight.in_use[handler.resource] -= 1
            for ctx in contexts:
                # A result still queued for writing keeps its lease renewed until then.
                if ctx.lost_lease and not ctx.settled:
                    inflight.release(ctx, "lease_lost", "lease lost while the handler ran")
            CURRENT.reset(log_token)
            if tracer is not None:
                tracer.leave(span_token)

    def _retire(self, call: Call) -> None:
        """Drop `call` from `active` once nothing of its handler runs any more."""
        body = call.body
        if body is None or body.done():
            self.active.discard(call)
        elif isinstance(body, concurrent.futures.Future):
            loop = asyncio.get_running_loop()

            def discard_on_the_loop(_: object) -> None:
                with contextlib.suppress(RuntimeError):  # the loop was closed first
                    loop.call_soon_threadsafe(self.active.discard, call)

            body.add_done_callback(discard_on_the_loop)
        else:
            body.add_done_callback(lambda _: self.active.discard(call))

    def _call_ended(self, call: Call, plain: bool) -> None:
        """The handler returned or raised: feed its run time to auto prefetch (the
        settlement that follows is the database's pace, not the handler's)."""
        if plain:
            self._plain_calls.discard(call)
            self._prefetch.observe(time.monotonic() - call.started)

    async def _invoke(
        self, handler: RegisteredHandler, contexts: list[TaskContext], call: Call
    ) -> Any:
        if handler.batch is not None:
            args: tuple[Any, ...] = (contexts,)
        elif handler.wants_payload:
            args = (contexts[0], contexts[0].payload)
        else:
            args = (contexts[0],)
        max_run_ms = self._max_run_ms
        if max_run_ms is None:
            if handler.is_async:  # the hot path: no extra coroutine layer
                value = await handler.fn(*args)
                if value is not None and inspect.isawaitable(value):
                    value = await value
                return value
            return await self._call_handler(handler, args, call)
        # max_run_ms bounds the whole call, an awaitable a sync handler returns included.
        running = asyncio.ensure_future(self._call_handler(handler, args, call))
        if call.body is None:
            call.body = running
        try:
            done, _ = await asyncio.wait({running}, timeout=max_run_ms / 1000)
        except asyncio.CancelledError:
            running.cancel()  # waiting was cancelled, not the handler: end it too
            running.add_done_callback(_consume_outcome)
            raise
        if not done:
            # Flag lease-lost first, so the abandoned handler cannot write any more.
            for ctx in contexts:
                ctx._mark_lost()
            running.cancel()
            running.add_done_callback(_consume_outcome)
            raise _MaxRunExceeded
        return running.result()

    async def _call_handler(
        self, handler: RegisteredHandler, args: tuple[Any, ...], call: Call
    ) -> Any:
        if handler.is_async:
            value = await handler.fn(*args)
        else:
            executor = self._executor()
            # The thread runs in a copy of the call's context: the task its logs name,
            # and the current span.
            run = contextvars.copy_context().run
            if executor is None:
                loop = asyncio.get_running_loop()
                value = await loop.run_in_executor(None, lambda: run(handler.fn, *args))
            else:
                # The thread's own future is kept: only it says when the handler's code
                # has really stopped (cancelling the await does not stop the thread).
                thread = call.body = executor.submit(run, handler.fn, *args)
                value = await asyncio.wrap_future(thread)
        if value is not None and inspect.isawaitable(value):
            value = await value
        return value

    # -- what the call left unsettled ----------------------------------------------------

    async def _settle_value(
        self, handler: RegisteredHandler, contexts: list[TaskContext], value: Any
    ) -> None:
        settlement = self._settlement
        results: Mapping[str, Any] | None = None
        if handler.batch is not None and isinstance(value, Mapping):
            results = value
        for ctx in contexts:
            if ctx.settled or ctx.lost_lease:
                continue
            if results is not None:
                result = results.get(ctx.task_id)
            else:
                result = None if handler.batch else value
            try:
                encoded = None if result is None else dump_json(result, what="result")
            except SerializationError as exc:
                error = envelope("SerializationError", "unserializable_result", str(exc))
                await settlement.settle_quietly(ctx, error, False)
                continue
            settlement.enqueue(ctx, encoded)
        if settlement.backlogged():
            await settlement.backpressure()

    async def _settle_error(self, contexts: list[TaskContext], exc: BaseException) -> None:
        if isinstance(exc, LostLease):
            return
        if isinstance(exc, TaskError):
            # The handler chose this envelope, details included: stored as given.
            error, retryable = exc.envelope(), exc.retryable
        else:
            error = envelope(type(exc).__name__, "handler_error", str(exc), retryable=True)
            error["details"] = {"traceback": format_traceback(exc)}
            retryable = True
        for ctx in contexts:
            if not ctx.settled and not ctx.lost_lease:
                record_failure(ctx, exc)
                task = await self._settlement.settle_quietly(ctx, error, retryable)
                self._failures.failed(ctx, exc, task)

    async def _settle_timeout(self, contexts: list[TaskContext]) -> None:
        message = f"handler ran longer than max_run_ms={self._max_run_ms}"
        error = envelope("HandlerTimeout", "handler_timeout", message, retryable=True)
        for ctx in contexts:
            if not ctx.settled:
                # Straight to the store although flagged lost: the flag only stops the
                # abandoned handler's own writes, the lease is still ours.
                task = await self._settlement.settle_quietly(ctx, error, True)
                self._failures.failed(ctx, TimeoutError(message), task)

    async def fail_no_handler(self, ctx: TaskContext) -> None:
        message = f"no handler registered for {ctx.name!r}"
        error = envelope("NoHandler", "no_handler", message)
        task = await self._settlement.settle_quietly(ctx, error, False)
        self._failures.failed(ctx, LookupError(message), task)


class _MaxRunExceeded(Exception):
    pass


async def _until_stopped(call: Call) -> None:
    """Wait until the code of a handler the cancel watch stopped has really ended: with
    `max_run_ms` it runs in a task of its own, which may swallow the cancellation. Its
    tasks stay held and renewed meanwhile, so they cannot run anywhere else beside it
    (a daemon child that waits too long is replaced)."""
    body = call.body
    if body is None or body.done():
        return
    waited = asyncio.wrap_future(body) if isinstance(body, concurrent.futures.Future) else body
    await asyncio.wait({waited})


def _consume_outcome(task: asyncio.Future[Any]) -> None:
    """An abandoned handler may still fail later; read its outcome so asyncio does not
    log 'exception was never retrieved' for a result nobody can use."""
    if not task.cancelled():
        task.exception()
