"""`Worker`: claims tasks, runs handlers, settles outcomes. A drop-in for the public
cairnq `Worker`, built to spend as little as possible per task.

Design notes.

- The loop claims up to the free call slots in one claim transaction, one draw per
  source in rotating order so no name starves (`claims`). `concurrency` counts handler
  calls, not tasks. Registration lives in `handlers`.
- Handler calls run in `calls.CallRunner`, which settles whatever a call leaves.
- One heartbeat loop per worker (`heartbeat`) renews every in-flight lease with a single
  `heartbeat_batch` per beat, marking contexts lease-lost or cancel-seen from the reply.
- Returned results are settled through a batcher (`settlement.CompleteBatcher`): written
  as set-based `complete_many` statements, carried by the next claim transaction while
  the claim loop runs. It never waits for a batch to fill.
- Sync handlers run in a thread pool sized to `concurrency`, so a blocking handler can
  never starve the heartbeat.
- `run()` drains in-flight calls in `finally`, however the loop exits.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from cairnqd._calls import Call, CallRunner, backoff_delay_ms
from cairnqd._claims import ClaimPlan, claim_sources
from cairnqd._handlers import (
    Handler,
    RegisteredHandler,
    check_positive,
    derived_name,
    make_handler,
)
from cairnqd._heartbeat import heartbeat_loop
from cairnqd._ids import new_worker_id
from cairnqd._prefetch import PrefetchSetting, PrefetchSizer
from cairnqd._settlement import CompleteBatcher
from cairnqd.context import TaskContext
from cairnqd.models import Task, TaskDef, task_name
from cairnqd.store.base import TaskStore

# Names callers import from here, as they did before the split.
__all__ = [
    "Handler",
    "OnError",
    "RegisteredHandler",
    "Worker",
    "WorkerObserver",
    "backoff_delay_ms",
]

OnError = Callable[[BaseException, dict[str, Any]], None]


class WorkerObserver(Protocol):
    """Hooks the daemon's child process uses to report task events to its parent."""

    def task_started(self, task: Task) -> None: ...

    def task_ended(self, task: Task, outcome: str, reason: str, duration_s: float) -> None: ...


class Worker:
    def __init__(
        self,
        store: TaskStore,
        queues: Sequence[str] = ("default",),
        *,
        concurrency: int = 1,
        lease_ms: int = 30_000,
        poll_interval_ms: int = 500,
        retry_backoff_ms: int = 1000,
        retry_backoff_max_ms: int = 30_000,
        max_run_ms: int | None = None,
        resources: Mapping[str, int] | None = None,
        max_queue_depth: int | Mapping[str, int] | None = None,
        max_queue_wait_ms: int = 600_000,
        on_error: OnError | None = None,
        prefetch: PrefetchSetting = "auto",
    ) -> None:
        """`prefetch` (cairnqd only): how many tasks to claim beyond the free call
        slots, for handlers without `batch` or `resource`. They wait in the worker with
        their leases renewed and start as slots free up, so a busy worker claims in
        bigger batches (fewer claim transactions per task); a stopping worker still
        runs them. "auto" (the default) claims ahead only what the handlers' observed
        pace will start within about 50 ms, so slow handlers never claim ahead; an
        integer fixes the count, and 0 claims exactly like the public SDK."""
        if isinstance(queues, str):
            queues = [queues]
        self.queues = list(queues)
        if not self.queues:
            raise ValueError("queues must name at least one queue")
        check_positive(concurrency, "concurrency")
        check_positive(lease_ms, "lease_ms")
        check_positive(poll_interval_ms, "poll_interval_ms")
        check_positive(max_run_ms, "max_run_ms", allow_none=True)
        self._prefetch = PrefetchSizer(prefetch)
        if retry_backoff_ms < 0 or retry_backoff_max_ms < 0:
            raise ValueError("retry_backoff_ms and retry_backoff_max_ms must be >= 0")
        self.store = store
        self.concurrency = concurrency
        self.lease_ms = lease_ms
        self.poll_interval_ms = poll_interval_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = retry_backoff_max_ms
        self.max_run_ms = max_run_ms
        self.resources: dict[str, int] = {}
        for res, capacity in (resources or {}).items():
            check_positive(capacity, f"resources[{res!r}]")
            self.resources[res] = capacity
        self.on_error = on_error
        self.prefetch = self._prefetch.setting
        self._slots = concurrency
        # Claimed ahead of a free slot (prefetch): tracked, heartbeated, not started.
        self._backlog: collections.deque[TaskContext] = collections.deque()
        self.observer: WorkerObserver | None = None
        if max_queue_depth is not None:
            store.use_backpressure(max_queue_depth, max_queue_wait_ms=max_queue_wait_ms)
        self._worker_id = new_worker_id()
        self._handlers: dict[str, RegisteredHandler] = {}
        self._owns_store = False
        self._stop = asyncio.Event()
        self._freed = asyncio.Event()
        self._calls: set[asyncio.Task[None]] = set()
        self._contexts: dict[str, TaskContext] = {}
        self._in_use: dict[str, int] = dict.fromkeys(self.resources, 0)
        self._rotation = 0
        self._executor: ThreadPoolExecutor | None = None
        self._settler = CompleteBatcher(self)
        self.claiming = True
        self._idling = False
        self._looping = False  # inside _claim_loop: its claims carry queued results
        self._ahead = 0  # the prefetch target the claim loop last worked to
        self._runner = CallRunner(self)
        # Hooks for a host process (the daemon's child) that retires a worker:
        # at most this many more tasks are claimed, then the worker stops once they
        # are done; and a check run before every claim, False to stop claiming.
        self.claim_budget: int | None = None
        #: Tasks whose handler call has ended (returned, raised or was abandoned).
        self.handled = 0
        self.before_claim: Callable[[], bool] | None = None

    # -- construction ------------------------------------------------------------------

    @classmethod
    def sqlite(
        cls,
        path: str,
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int = 1,
        lease_ms: int = 30_000,
        busy_timeout_ms: int = 5000,
        **kw: Any,
    ) -> Worker:
        from cairnqd.store.sqlite import SQLiteStore

        worker = cls(
            SQLiteStore(path, busy_timeout_ms=busy_timeout_ms),
            queues,
            concurrency=concurrency,
            lease_ms=lease_ms,
            **kw,
        )
        worker._owns_store = True
        return worker

    @classmethod
    def postgres(
        cls,
        source: str,
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int = 1,
        lease_ms: int = 30_000,
        min_size: int = 1,
        max_size: int = 10,
        schema: str | None = None,
        **kw: Any,
    ) -> Worker:
        from cairnqd.store.postgres import PostgresStore

        store = PostgresStore(source, min_size=min_size, max_size=max_size, schema=schema)
        worker = cls(store, queues, concurrency=concurrency, lease_ms=lease_ms, **kw)
        worker._owns_store = True
        return worker

    @property
    def worker_id(self) -> str:
        return self._worker_id

    @worker_id.setter
    def worker_id(self, value: str) -> None:
        # The daemon names workers `{host}:{group}.{slot}:{ULID}`.
        self._worker_id = value

    @property
    def handlers(self) -> Mapping[str, RegisteredHandler]:
        return self._handlers

    def task(
        self,
        name: str | TaskDef[Any, Any] | Handler | None = None,
        *,
        batch: int | None = None,
        resource: str | None = None,
    ) -> Any:
        """Register a handler: `@worker.task`, `@worker.task("name")`, or with a TaskDef."""
        if callable(name) and not isinstance(name, str | TaskDef):
            fn = name
            self.register(derived_name(fn), fn, batch=batch, resource=resource)
            return fn

        def decorate(fn: Handler) -> Handler:
            chosen = derived_name(fn) if name is None else task_name(name)
            self.register(chosen, fn, batch=batch, resource=resource)
            return fn

        return decorate

    def register(
        self,
        name: str | TaskDef[Any, Any],
        fn: Handler,
        *,
        batch: int | None = None,
        resource: str | None = None,
    ) -> None:
        handler = make_handler(name, fn, batch=batch, resource=resource, resources=self.resources)
        self._handlers[handler.name] = handler

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; `run()` returns once in-flight calls have finished."""
        self._stop.set()
        self._freed.set()

    async def close(self) -> None:
        self.stop()
        if self._owns_store:
            await self.store.close()

    def serve(self, *, concurrency: int | None = None) -> None:
        """Run until SIGINT/SIGTERM. The first signal stops claiming and drains; the
        handlers are then removed, so a second Ctrl-C reaches Python's default."""

        async def main() -> None:
            loop = asyncio.get_running_loop()
            signals = (signal.SIGINT, signal.SIGTERM)

            def on_signal() -> None:
                for sig in signals:
                    loop.remove_signal_handler(sig)
                self.stop()

            for sig in signals:
                loop.add_signal_handler(sig, on_signal)
            try:
                await self.run(concurrency=concurrency)
            finally:
                for sig in signals:
                    loop.remove_signal_handler(sig)
                if self._owns_store:
                    await self.store.close()

        asyncio.run(main())

    @contextlib.asynccontextmanager
    async def background(self, *, concurrency: int | None = None) -> AsyncIterator[Worker]:
        """Run the worker as a task for the body of an `async with`."""
        runner = asyncio.create_task(self.run(concurrency=concurrency))
        body_error: BaseException | None = None
        try:
            yield self
        except BaseException as exc:
            body_error = exc
            raise
        finally:
            self.stop()
            try:
                await runner
            except Exception as worker_error:
                if body_error is None:
                    raise
                if body_error.__cause__ is None:
                    body_error.__cause__ = worker_error
            finally:
                if self._owns_store:
                    await self.store.close()

    async def run(self, *, concurrency: int | None = None) -> None:
        limit = max(1, concurrency if concurrency is not None else self.concurrency)
        self._slots = limit
        # A stop() issued before this task first ran must still count, so the events
        # are not reset here; they are cleared on the way out instead.
        await self.store.connect()
        # Threads a max_run_ms abandons keep running; headroom so they never hold the
        # slots a retry needs. Threads are created lazily, so the cap costs nothing.
        self._executor = ThreadPoolExecutor(
            max_workers=limit + _ABANDONED_THREAD_HEADROOM, thread_name_prefix="cairnqd-sync"
        )
        heartbeat = asyncio.create_task(heartbeat_loop(self))
        try:
            await self._claim_loop(limit)
        finally:
            # Drain however the loop exited, prefetched tasks included; heartbeats
            # keep running meanwhile.
            while self._calls or self._backlog:
                if self._backlog and len(self._calls) < limit:
                    self._start_backlog(limit - len(self._calls))
                    continue
                await asyncio.wait(set(self._calls), return_when=asyncio.FIRST_COMPLETED)
            await self._settler.drain()
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            self._executor.shutdown(wait=False)
            self._stop.clear()
            self._freed.clear()

    # -- the claim loop ----------------------------------------------------------------

    async def _claim_loop(self, limit: int) -> None:
        self._looping = True
        try:
            await self._claim_cycles(limit)
        finally:
            self._looping = False

    def _claims_will_settle(self) -> bool:
        """Whether a claim will soon carry queued results (else a flusher must)."""
        return (
            self._looping
            and not self._idling
            and self.claiming
            and bool(self._handlers)
            and not self._stop.is_set()
        )

    def _may_claim(self) -> bool:
        if self.claim_budget is not None and self.claim_budget <= 0:
            return False
        return self.before_claim is None or self.before_claim()

    def _wake(self) -> None:
        """Cut the claim loop's wait for a free slot short (a result is due)."""
        self._freed.set()

    async def _claim_cycles(self, limit: int) -> None:
        while not self._stop.is_set():
            free = limit - len(self._calls)
            if self._backlog and free > 0:
                self._start_backlog(free)
                free = limit - len(self._calls)
            # With prefetch, claim again once the backlog is half spent, even with
            # every slot busy: the claim carries the finished results with it.
            ahead = self._ahead = self.prefetch_target()
            refill = ahead > 0 and len(self._backlog) <= ahead // 2
            if free <= 0 and not refill and not self._settler.due():
                self._freed.clear()
                await self._freed.wait()
                continue
            if not self._handlers or not self.claiming:
                await self._idle()
                continue
            if not self._may_claim():
                self.stop()
                break
            if self.claim_budget is not None:
                # Never claim past the budget, prefetch included: a retiring worker
                # would otherwise carry a backlog it must still run.
                free = min(free, self.claim_budget)
                ahead = min(ahead, self.claim_budget - free + len(self._backlog))
            # Cleared before the claim: a resource released (or stop()) while the claim
            # runs must cut the idle wait that may follow it short.
            self._freed.clear()
            try:
                claimed = await self._claim(free, ahead)
            except Exception as exc:
                self._report(exc, {"phase": "claim"})
                await self._sleep_unless_stopped(0.25)
                continue
            if self.claim_budget is not None:
                self.claim_budget -= len(claimed)
            if not claimed:
                if free > 0 or len(self._backlog) < ahead:
                    await self._idle()  # asked for tasks and found none
                # else: a cycle only to write due results; nothing was asked for
                continue
            self._dispatch(claimed, free)
            # Let the new calls start before the next claim.
            await asyncio.sleep(0)

    async def _idle(self) -> None:
        """Wait for a wake-up from the store, a freed resource, stop, or the poll."""
        self._idling = True
        self._settler.put_back([])  # nothing will claim soon: write any results now
        wake = asyncio.ensure_future(self.store.claim_wake(self.queues, self.poll_interval_ms))
        freed = asyncio.ensure_future(self._freed.wait())
        try:
            await asyncio.wait({wake, freed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._idling = False
            for fut in (wake, freed):
                fut.cancel()

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    def prefetch_target(self) -> int:
        """Tasks to hold claimed beyond the free slots right now."""
        if not self._prefetch.adaptive:
            return self._prefetch.target(self._slots)
        return self._prefetch.target(self._slots, self._runner.longest_plain_call())

    async def _claim(self, free: int, ahead_target: int) -> list[Task]:
        sources = claim_sources(self._handlers)
        if not sources:
            return []
        start = self._rotation % len(sources)
        self._rotation += 1
        ordered = sources[start:] + sources[:start]
        names = [n for s in sources for n in s.names]
        ahead = max(0, ahead_target - len(self._backlog))

        plan = ClaimPlan(ordered, free, ahead, self.resources, self._in_use)
        settle = self._settler.take()
        try:
            result = await self.store.claim_session(
                queues=self.queues,
                worker_id=self._worker_id,
                lease_ms=self.lease_ms,
                names=names,
                plan=plan,
                settle=[(ctx.task_id, encoded) for ctx, encoded in settle],
                on_settled=lambda statuses: self._settler.finish(settle, statuses),
            )
        except BaseException:
            self._settler.put_back(settle)
            raise
        return result or []

    def _dispatch(self, claimed: list[Task], free: int) -> None:
        """Start calls for what was claimed; plain tasks beyond the `free` call slots
        (prefetched) wait in the backlog."""
        by_name: dict[str, list[Task]] = {}
        plain: list[Task] = []
        for task in claimed:
            handler = self._handlers.get(task.name)
            if handler is not None and handler.batch is None and handler.resource is None:
                plain.append(task)
            else:
                by_name.setdefault(task.name, []).append(task)
        for name, tasks in by_name.items():
            handler = self._handlers.get(name)
            if handler is None:
                # Unregistered between claim and dispatch: fail permanently, never run.
                for task in tasks:
                    ctx = self._track(task)
                    self._spawn(self._runner.fail_no_handler(ctx))
                continue
            size = handler.batch or 1
            for i in range(0, len(tasks), size):
                contexts = [self._track(t) for t in tasks[i : i + size]]
                if handler.resource is not None:
                    self._in_use[handler.resource] += 1
                self._spawn(self._runner.execute(Call(handler, contexts)))
                free -= 1
        for task in plain:
            self._backlog.append(self._track(task))
        self._start_backlog(free)

    def _start_backlog(self, free: int) -> None:
        runner = self._runner
        while self._backlog and free > 0:
            ctx = self._backlog.popleft()
            handler = self._handlers.get(ctx.name)
            if ctx.lost_lease:
                self._forget(ctx)  # recovered elsewhere while it waited
                continue
            if handler is None:
                self._spawn(runner.fail_no_handler(ctx))  # unregistered while it waited
            else:
                self._spawn(runner.execute(Call(handler, [ctx])))
            free -= 1

    def _track(self, task: Task) -> TaskContext:
        ctx = TaskContext(self, task)
        self._contexts[task.id] = ctx
        if self.observer is not None:
            self.observer.task_started(task)
        return ctx

    def _forget(self, ctx: TaskContext) -> None:
        self._contexts.pop(ctx.task_id, None)

    def _spawn(self, coro: Awaitable[None]) -> None:
        call = asyncio.ensure_future(coro)
        self._calls.add(call)
        call.add_done_callback(self._call_done)

    def _call_done(self, call: asyncio.Task[None]) -> None:
        self._calls.discard(call)
        self._freed.set()

    def _report(self, exc: BaseException, info: dict[str, Any]) -> None:
        if self.on_error is None:
            return
        with contextlib.suppress(BaseException):
            self.on_error(exc, info)


_ABANDONED_THREAD_HEADROOM = 32
