"""One handler call, from its start to the settlement of every task it held.

A call starts only the tasks whose lease is still ours; whatever the handler leaves
unsettled is settled here (returned: completed; raised, `CancelledError`, `SystemExit`
and the handler's own `KeyboardInterrupt` included: failed; a Ctrl-C: nothing, the
process stops; `LostLease`: nothing; past `max_run_ms`: `handler_timeout`; stopped by
the cancel watch: completed, which a pending cancel turns into canceled). `active`
keeps a call while a handler it gave up on still runs. Why: docs/architecture.md,
"Handler calls".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dis
import functools
import inspect
import signal
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cairnqd._failures import FailureLog, cut_message, format_traceback
from cairnqd._handlers import RegisteredHandler
from cairnqd._inflight import InFlight
from cairnqd._jsoncodec import dump_json
from cairnqd._prefetch import PrefetchSizer
from cairnqd._settlement import Settlement, envelope, storable_error
from cairnqd.errors import LostLease, SerializationError, TaskError, exception_text
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
        # False while what ends the call may leave its tasks unsettled: the call
        # cancelled from outside the worker, or a Ctrl-C, propagating out of here.
        settling = False
        try:
            error: BaseException | None = None
            canceled = False
            try:
                value = await self._invoke(handler, contexts, call)
            except _Raised as carried:
                value, error = None, carried.exc
            except KeyboardInterrupt as exc:
                if not _handlers_own(exc):
                    # A Ctrl-C landed in the handler's frame (the second one, mostly):
                    # it stops the process, and the task is left to its lease, not failed.
                    raise
                value, error = None, exc
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
            settling = True
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
                elif not settling and not ctx.settled:
                    # Left to its lease, which must then be let go: held, the heartbeat
                    # renewed it for as long as the worker lived (a handler can cancel
                    # its own task, and the worker then runs on), so the task stayed
                    # `running` with nothing running it.
                    inflight.release(
                        ctx, "lease_lost", "the handler call was cut short (cancelled, or a Ctrl-C)"
                    )
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
        """The handler's call but for the hot path's; under `max_run_ms` it runs as a
        task of its own, which a `KeyboardInterrupt` or `SystemExit` must not end (see
        `_Raised`)."""
        try:
            if handler.is_async:
                value = await handler.fn(*args)
            else:
                executor = self._executor()
                # The thread runs in a copy of the call's context: the task its logs
                # name, and the current span.
                run = contextvars.copy_context().run
                if executor is None:
                    loop = asyncio.get_running_loop()
                    value = await loop.run_in_executor(None, _in_thread, run, handler.fn, *args)
                else:
                    # The thread's own future is kept: only it says when the handler's
                    # code has really stopped (cancelling the await does not stop the
                    # thread).
                    thread = call.body = executor.submit(_in_thread, run, handler.fn, *args)
                    value = await asyncio.wrap_future(thread)
            if value is not None and inspect.isawaitable(value):
                value = await value
            return value
        except KeyboardInterrupt as exc:
            if not _handlers_own(exc):
                raise  # a Ctrl-C: see `execute`
            raise _Raised(exc) from None
        except SystemExit as exc:
            raise _Raised(exc) from None

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
            try:
                if results is not None:
                    result = results.get(ctx.task_id)
                else:
                    result = None if handler.batch else value
                encoded = None if result is None else dump_json(result, what="result")
            except SerializationError as exc:
                problem = str(exc)
            except Exception as exc:
                # The returned object's own code raised while it was read (a mapping
                # whose `items()` or `get` raises): that escaped the call with the
                # task neither written nor let go, and the heartbeat renewed its
                # lease for as long as the worker lived. Failed as any result that
                # cannot be stored: the same value would come back on a retry.
                problem = f"result could not be read: {type(exc).__name__}: {exception_text(exc)}"
            else:
                settlement.enqueue(ctx, encoded)
                continue
            error = envelope("SerializationError", "unserializable_result", problem)
            await settlement.settle_quietly(ctx, error, False)
        if settlement.backlogged():
            await settlement.backpressure()

    async def _settle_error(self, contexts: list[TaskContext], exc: BaseException) -> None:
        if isinstance(exc, LostLease):
            return
        error, retryable = _failure(exc)
        for ctx in contexts:
            if not ctx.settled and not ctx.lost_lease:
                try:
                    record_failure(ctx, exc)
                except BaseException as problem:
                    # The span renders `exc` its own way, calling the handler author's
                    # `__str__` (which may raise anything): the failure comes first.
                    self._settlement.inflight.report(
                        problem, {"phase": "execute", "task_id": ctx.task_id}
                    )
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


def _failure(exc: BaseException) -> tuple[dict[str, Any], bool]:
    """The envelope a handler's `exc` is stored as, and whether its task may retry.
    Never raises: whatever `exc` is, its task must be failed (docs/protocol.md §4.5)."""
    if isinstance(exc, TaskError):
        try:
            # The handler chose this envelope, details included: stored as given (but
            # for the escapes and the cut of `storable_error`).
            return storable_error(exc.envelope(), exc.retryable), bool(exc.retryable)
        except BaseException as problem:  # whatever the handler author's code raised
            # Its attributes were changed after it was made, or a subclass overrides
            # `envelope`: then it is failed as any other exception, saying why.
            error = _handler_error(exc)
            error["details"]["envelope_error"] = cut_message(
                f"{type(problem).__name__}: {exception_text(problem)}"
            )
            return error, True
    return _handler_error(exc), True


def _handler_error(exc: BaseException) -> dict[str, Any]:
    message = cut_message(exception_text(exc))
    error = envelope(type(exc).__name__, "handler_error", message, retryable=True)
    error["details"] = {"traceback": format_traceback(exc)}
    return error


class _MaxRunExceeded(Exception):
    pass


class _Raised(Exception):
    """Carries a `KeyboardInterrupt` or `SystemExit` the handler's own code raised out
    of the thread or task it ran in, to be failed as the handler's error: asyncio
    re-raises either one out of the event loop from any task it ends, which would end
    the whole worker and leave the task to its lease, to end the next worker in turn."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(type(exc).__name__)
        self.exc = exc


def _in_thread(run: Callable[..., Any], fn: Callable[..., Any], *args: Any) -> Any:
    """A sync handler's call on its thread. Signals reach Python only in the main
    thread, so a `KeyboardInterrupt` here is always the handler's own, never a Ctrl-C."""
    try:
        return run(fn, *args)
    except KeyboardInterrupt as exc:
        raise _Raised(exc) from None


_RAISE_VARARGS = dis.opmap["RAISE_VARARGS"]


def _handlers_own(exc: KeyboardInterrupt) -> bool:
    """Whether a `KeyboardInterrupt` raised on the event loop's thread (by an async
    handler, or the awaitable a sync one returned) is the handler's own rather than a
    Ctrl-C, which arrives as the same exception in whatever frame runs: Python's
    default SIGINT handler raises it after the first Ctrl-C under `serve()` (which then
    removes its own) and under any plain loop, and `asyncio.run`'s handler raises it on
    the second.

    Told apart by where it was raised, failing safe (a doubt is a Ctrl-C: a worker that
    a Ctrl-C cannot stop is worse than one task left to its lease):
    - the handler's own was raised by a `raise` statement, so its innermost traceback
      entry stops on RAISE_VARARGS; a signal's stops where the interpreter checked for
      signals (a backward jump, a call), never there, or
    - it went through a Python-level signal handler that raised (asyncio.run's), whose
      frame is then in the traceback;
    - and every `KeyboardInterrupt` it was raised while handling is the handler's own
      too (`except KeyboardInterrupt: raise KeyboardInterrupt(...)` keeps a Ctrl-C one).
    """
    try:
        handlers = _signal_handler_code()
        seen: set[int] = set()
        chain: list[BaseException] = [exc]
        while chain:
            current = chain.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            if isinstance(current, KeyboardInterrupt) and not _raised_by_statement(
                current, handlers
            ):
                return False
            chain.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        return True
    except BaseException:  # a doubt is a Ctrl-C
        return False


def _raised_by_statement(exc: BaseException, handlers: set[object]) -> bool:
    tb = exc.__traceback__
    if tb is None:
        return False
    while True:
        code = tb.tb_frame.f_code
        if code in handlers:
            return False
        if tb.tb_next is None:
            break
        tb = tb.tb_next
    raw = code.co_code
    return 0 <= tb.tb_lasti < len(raw) and raw[tb.tb_lasti] == _RAISE_VARARGS


def _signal_handler_code() -> set[object]:
    """The code of every Python function installed as a signal handler now, seen
    through what usually wraps one: `asyncio.run`'s is a partial of a bound method."""
    found: set[object] = set()
    for sig in signal.valid_signals():
        try:
            handler: Any = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        for _ in range(8):  # a wrapper of a wrapper ..., not for ever
            if isinstance(handler, functools.partial):
                handler = handler.func
            elif inspect.ismethod(handler):
                handler = handler.__func__
            else:
                break
        code = getattr(handler, "__code__", None)
        if code is None and callable(handler):  # an object with a __call__ method
            code = getattr(getattr(type(handler), "__call__", None), "__code__", None)  # noqa: B004
        if code is not None:
            found.add(code)
    return found


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
