"""`Worker`: claims tasks, runs handlers, settles outcomes.

A drop-in for the public cairnq `Worker`, built to spend as little as possible per task:
a few parts around one in-flight table (`_inflight.InFlight`). See docs/architecture.md,
"Inside a worker", for the parts and for what a crash costs a bare worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from cairnqd import tasklog, tracing
from cairnqd._calls import CallRunner
from cairnqd._cancels import DEFAULT_CANCEL_GRACE_S, CancelOverrunHook, CancelWatch
from cairnqd._claimloop import ClaimLoop, WakeGate
from cairnqd._countflush import CountFlusher
from cairnqd._handlers import (
    Handler,
    RegisteredHandler,
    check_positive,
    derived_name,
    make_handler,
)
from cairnqd._heartbeat import heartbeat_loop
from cairnqd._ids import new_worker_id
from cairnqd._inflight import InFlight, LoopState, WorkerObserver
from cairnqd._leaseguard import LeaseGuard, OverrunHook
from cairnqd._lograte import Repeats
from cairnqd._pauses import PausedQueues
from cairnqd._prefetch import PrefetchSetting, PrefetchSizer
from cairnqd._settlement import Settlement, backoff_delay_ms
from cairnqd.limits import Limit, parse_limits
from cairnqd.models import TaskDef, task_name
from cairnqd.queue_counts import QueueTally
from cairnqd.store.arguments import (
    INT8_MAX,
    MAX_DURATION_MS,
    MAX_TEXT_BYTES,
    MAX_WORKER_COUNT,
    require_duration,
    require_int,
    require_number,
    require_str,
    shown,
)
from cairnqd.store.base import TaskStore

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

__all__ = [
    "Handler",
    "OnError",
    "RegisteredHandler",
    "Worker",
    "WorkerObserver",
    "backoff_delay_ms",
]

OnError = Callable[[BaseException, dict[str, Any]], None]

log = logging.getLogger("cairnqd.worker")

#: The shortest lease a worker takes. Leases are renewed every max(50, lease/3) ms
#: (`_heartbeat`), and a task starts, and its handler is left running, only until
#: max(50 ms, lease/5) before its lease ends (`_inflight.lease_margin_s`, the lease
#: guard), both counted from when the claim or renewal was sent. At 100 ms a task
#: claimed just after a renewal reaches that stop point before the next one is answered,
#: and at 50 ms or less no task starts at all: each is claimed, then released as
#: lease-lost, and the worker never runs one. From 250 ms, what is left of a lease after
#: a renewal interval and the margin (250 - 83 - 50 ms, more above) is over 100 ms, for
#: the claim's and the renewal's round trips on a loaded host.
MIN_LEASE_MS = 250
#: The longest `cancel_grace`, in seconds: the longest duration the store takes.
MAX_CANCEL_GRACE_S = MAX_DURATION_MS // 1000


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
        honour_pauses: bool = False,
        limits: Mapping[str, Any] | Sequence[Limit] | None = None,
        keep_counts: bool = True,
        cancel_grace: float = DEFAULT_CANCEL_GRACE_S,
    ) -> None:
        """`prefetch` (cairnqd only): how many tasks to claim beyond the free call
        slots, for handlers without `batch` or `resource`. They wait in the worker with
        their leases renewed and start as slots free up, so a busy worker claims in
        bigger batches (fewer claim transactions per task); a stopping worker still
        runs them. "auto" (the default) claims ahead only what the handlers' observed
        pace will start within about 50 ms, so slow handlers never claim ahead; an
        integer fixes the count, and 0 claims exactly like the public SDK.

        `honour_pauses` (cairnqd only): skip queues an operator paused with `cairnqd
        pause` (read about twice a second, `_pauses`). Off by default, so a bare worker
        claims as the public SDK does; every daemon child turns it on.

        `limits` (cairnqd only): flow-control limits this worker's claims keep, shared
        with every cairnqd worker on the database: `{name: {queues, names, concurrency,
        rate, partition_by}}` as in the daemon's `limits:` section (docs/limits.md).

        `keep_counts` (cairnqd only): add per-queue counts of this worker's finished
        tasks (outcomes, run and wait times) to `cairnqd_queue_counts` every 10 s, for
        the dashboard's charts (cairnqd/queue_counts.py); False keeps none.

        `cancel_grace` (cairnqd only): seconds a handler whose task was canceled has to
        return by itself (`ctx.canceled()` says True) before an async handler is
        cancelled (`CancelledError`); its task then ends canceled. A handler still
        running a grace later (a sync one: its thread cannot be stopped) keeps its task
        held until it returns: see `on_cancel_overrun` and docs/operations.md."""
        # Every setting is checked here, before the store is touched: the claim loop
        # reports its errors only to `on_error`, so a setting that failed each claim
        # or settlement instead made a worker that silently never ran a task.
        self.queues = _checked_queues(queues)
        _check_count(concurrency, "concurrency")
        require_duration(lease_ms, "lease_ms", minimum=MIN_LEASE_MS)
        require_duration(poll_interval_ms, "poll_interval_ms", minimum=1)
        if isinstance(max_run_ms, int) and not isinstance(max_run_ms, bool) and max_run_ms <= 0:
            raise ValueError(f"max_run_ms must be > 0, got {max_run_ms}")  # the SDK's words
        check_positive(max_run_ms, "max_run_ms", allow_none=True)
        if max_run_ms is not None:
            require_duration(max_run_ms, "max_run_ms", minimum=1)
        prefetch_sizer = PrefetchSizer(prefetch)
        if isinstance(prefetch, int):
            require_int(prefetch, "prefetch", maximum=MAX_WORKER_COUNT)
        # A retry's delay is at most retry_backoff_max_ms (or the base, if smaller),
        # and is written as the failure's delay_ms: past what the store takes, the
        # failure could not be written and the task stayed running until its lease ended.
        require_duration(retry_backoff_ms, "retry_backoff_ms")
        require_duration(retry_backoff_max_ms, "retry_backoff_max_ms")
        declared = _checked_resources(resources)
        require_duration(max_queue_wait_ms, "max_queue_wait_ms")
        if on_error is not None and not callable(on_error):
            raise ValueError(f"on_error must be callable or None, got {shown(on_error)}")
        _check_cancel_grace(cancel_grace)
        self.store = store
        self.concurrency = concurrency
        self.lease_ms = lease_ms
        self.poll_interval_ms = poll_interval_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = retry_backoff_max_ms
        self.max_run_ms = max_run_ms
        self.resources = declared
        self.on_error = on_error
        # Errors reported while no `on_error` hook is set go to the log instead, each
        # kind at most once per 30 s (a failing database fails every claim).
        self._unreported = Repeats()
        self.prefetch = prefetch_sizer.setting
        if max_queue_depth is not None:
            store.use_backpressure(max_queue_depth, max_queue_wait_ms=max_queue_wait_ms)
        self.limits = parse_limits(limits)
        if self.limits:
            store.use_limits(self.limits)
        self._handlers: dict[str, RegisteredHandler] = {}
        self._owns_store = False
        self._executor: ThreadPoolExecutor | None = None
        self._state = LoopState()
        #: The tasks this worker holds, for a host process (the daemon's child).
        self.in_flight = InFlight(lease_ms, self._report, new_worker_id())
        self.in_flight.in_use.update(dict.fromkeys(self.resources, 0))
        if keep_counts:
            self.in_flight.tally = QueueTally()
        self._settlement = Settlement(
            store,
            self.in_flight,
            self._state,
            concurrency=concurrency,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
        )
        runner = CallRunner(
            self.in_flight,
            self._settlement,
            prefetch_sizer,
            max_run_ms=max_run_ms,
            executor=lambda: self._executor,
        )
        self._runner = runner
        self._guard = LeaseGuard(self.in_flight, runner)
        self._cancels = CancelWatch(store, self.in_flight, runner, cancel_grace)
        self._loop = ClaimLoop(
            store,
            self.queues,
            self._handlers,
            self.in_flight,
            self._state,
            self._settlement,
            runner,
            prefetch_sizer,
            poll_interval_ms=poll_interval_ms,
            resources=self.resources,
        )
        if honour_pauses:
            self._loop.pauses = PausedQueues(store, self.queues, self._report)

    # -- what a host process (the daemon's child) reads and sets ----------------------

    @property
    def observer(self) -> WorkerObserver | None:
        return self.in_flight.observer

    @observer.setter
    def observer(self, value: WorkerObserver | None) -> None:
        self.in_flight.observer = value

    @property
    def on_lease_overrun(self) -> OverrunHook | None:
        """Called with the tasks of a handler that is still running although its lease
        is about to end (renewals failed or stalled, and the handler ignored its
        cancellation, or is a sync handler whose thread cannot be stopped). The
        daemon's child exits there; None (the default) logs an error."""
        return self._guard.on_overrun

    @on_lease_overrun.setter
    def on_lease_overrun(self, hook: OverrunHook | None) -> None:
        self._guard.on_overrun = hook

    @property
    def on_cancel_overrun(self) -> CancelOverrunHook | None:
        """Called with the tasks of a canceled handler still running `cancel_grace`
        after it was cancelled (a sync handler, or one that swallowed the
        `CancelledError`). The daemon's child has its parent replace it there; None
        (the default) logs an error, and the task stays held until the handler returns."""
        return self._cancels.on_overrun

    @on_cancel_overrun.setter
    def on_cancel_overrun(self, hook: CancelOverrunHook | None) -> None:
        self._cancels.on_overrun = hook

    @property
    def cancel_grace(self) -> float:
        """Seconds a canceled handler has to return, then to stop; settable while running."""
        return self._cancels.grace_s

    @cancel_grace.setter
    def cancel_grace(self, value: float) -> None:
        _check_cancel_grace(value)
        self._cancels.grace_s = value

    @property
    def lease_guard(self) -> LeaseGuard:
        """The guard that stops handlers whose leases cannot be renewed."""
        return self._guard

    @property
    def claiming(self) -> bool:
        """False keeps the worker from claiming (a host's "quiet"); held tasks run."""
        return self._state.claiming

    @claiming.setter
    def claiming(self, value: bool) -> None:
        self._state.claiming = value
        self._state.wake()

    @property
    def claim_budget(self) -> int | None:
        """At most this many more tasks are claimed, then the worker stops once they
        are done (a host retiring the worker after max_tasks); None: no limit."""
        return self._loop.claim_budget

    @claim_budget.setter
    def claim_budget(self, value: int | None) -> None:
        if value is not None:
            # 0 is a budget spent: the worker stops claiming and stops.
            require_int(value, "claim_budget", minimum=0, maximum=INT8_MAX)
        self._loop.claim_budget = value

    @property
    def before_claim(self) -> Callable[[], bool] | None:
        """Checked before every claim; returning False stops claiming for good."""
        return self._loop.before_claim

    @before_claim.setter
    def before_claim(self, value: Callable[[], bool] | None) -> None:
        self._loop.before_claim = value

    @property
    def on_room(self) -> Callable[[bool], None] | None:
        """Called with True when a task claimed now would start at once (a free call
        slot, no claimed task waiting for one), False when not; only when that flips."""
        return self._loop.on_room

    @on_room.setter
    def on_room(self, value: Callable[[bool], None] | None) -> None:
        self._loop.on_room = value

    @property
    def wake_gate(self) -> WakeGate | None:
        """Set by a host that runs several workers on the same queues: this one answers
        the store's wake-ups only while it holds the gate (`WakeGate`)."""
        return self._loop.wake_gate

    @wake_gate.setter
    def wake_gate(self, value: WakeGate | None) -> None:
        self._loop.wake_gate = value

    @property
    def empty_wakes(self) -> int:
        """Wake-ups (a notification, or the poll) whose claim found nothing."""
        return self._loop.empty_wakes

    @property
    def handled(self) -> int:
        """Tasks whose handler call has ended (returned, raised or was abandoned)."""
        return self.in_flight.handled

    def prefetch_target(self) -> int:
        """Tasks to hold claimed beyond the free slots right now."""
        return self._loop.prefetch_target()

    @property
    def paused_queues(self) -> frozenset[str]:
        """This worker's queues it found paused (empty unless `honour_pauses`)."""
        pauses = self._loop.pauses
        return frozenset() if pauses is None else pauses.paused

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
        source: str | AsyncConnectionPool[Any],
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int = 1,
        lease_ms: int = 30_000,
        min_size: int = 1,
        max_size: int = 10,
        schema: str | None = None,
        pooler: str = "none",
        direct_dsn: str | None = None,
        **kw: Any,
    ) -> Worker:
        from cairnqd.store.postgres import PostgresStore

        store = PostgresStore(
            source,
            min_size=min_size,
            max_size=max_size,
            schema=schema,
            pooler=pooler,
            direct_dsn=direct_dsn,
        )
        worker = cls(store, queues, concurrency=concurrency, lease_ms=lease_ms, **kw)
        worker._owns_store = True
        return worker

    @property
    def worker_id(self) -> str:
        return self.in_flight.worker_id

    @worker_id.setter
    def worker_id(self, value: str) -> None:
        # The daemon names workers `{host}:{group}.{slot}:{ULID}`.
        self.in_flight.worker_id = value

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
        if name is not None:
            # Refused here rather than once the decorated function is defined.
            _check_task_name(task_name(name))

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
        _check_task_name(task_name(name))
        handler = make_handler(name, fn, batch=batch, resource=resource, resources=self.resources)
        if batch is not None:
            require_int(batch, "batch", maximum=MAX_WORKER_COUNT)
        self._handlers[handler.name] = handler
        self._state.has_handlers = True

    def set_limits(self, limits: Mapping[str, Any] | Sequence[Limit] | None) -> None:
        """Keep these flow-control limits from the next claim on (a reloaded config):
        the same forms as `limits=`; None or empty: no limits. The tasks running now
        keep the room they hold, and a lowered limit starts nothing new until below it
        (docs/limits.md, "Seeing and changing them")."""
        self.limits = parse_limits(limits)
        self.store.use_limits(self.limits)

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; `run()` returns once in-flight calls have finished."""
        self._state.stop.set()
        self._state.freed.set()

    async def close(self) -> None:
        self.stop()
        if self._owns_store:
            await self.store.close()

    def serve(self, *, concurrency: int | None = None) -> None:
        """Run until SIGINT/SIGTERM. The first signal stops claiming and drains; the
        handlers are then removed, so a second Ctrl-C reaches Python's default."""
        _run_slots(concurrency, self.concurrency)

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
        _run_slots(concurrency, self.concurrency)  # raised here, not when the body ends
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
        limit = _run_slots(concurrency, self.concurrency)
        state = self._state
        state.has_handlers = bool(self._handlers)
        # A stop() issued before this task first ran must still count, so the events
        # are not reset here; they are cleared on the way out instead.
        await self.store.connect()
        # Decided once: a provider set later is not seen by a running worker.
        self._runner.tracer = tracing.consumer()
        tasklog.install()
        # Threads a max_run_ms abandons keep running; headroom so they never hold the
        # slots a retry needs. Threads are created lazily, so the cap costs nothing.
        self._executor = ThreadPoolExecutor(
            max_workers=limit + _ABANDONED_THREAD_HEADROOM, thread_name_prefix="cairnqd-sync"
        )
        heartbeat = asyncio.create_task(heartbeat_loop(self.store, self.in_flight))
        guard = asyncio.create_task(self._guard.run())
        cancels = asyncio.create_task(self._cancels.run())
        helpers = [heartbeat, guard, cancels]
        tally = self.in_flight.tally
        counts = None if tally is None else CountFlusher(self.store, tally)
        if counts is not None:
            helpers.append(asyncio.create_task(counts.run()))
        drained = False
        try:
            await self._loop.run(limit)
        finally:
            try:
                # Drain however the loop exited, prefetched tasks included; heartbeats
                # and the lease guard keep running meanwhile.
                await self._loop.drain(limit)
                await self._settlement.drain()
                drained = True
            finally:
                # A cancellation of run() itself while it drained (`wait_for` after
                # stop(), a second cancel) ends the drain here: before, it skipped
                # all of this, and the heartbeat, the lease guard, the cancel watch
                # and the calls ran on for the life of the event loop, renewing the
                # leases of handlers nobody would wait for. The calls are cancelled
                # too, and their tasks left to their leases (`CallRunner.execute`).
                if not drained:
                    for call in list(self._loop.calls):
                        call.cancel()
                for helper in helpers:
                    helper.cancel()
                await asyncio.wait(helpers)
                for helper in helpers:
                    problem = None if helper.cancelled() else helper.exception()
                    if problem is not None:
                        raise problem
                if counts is not None and drained:
                    await counts.last()
                self._executor.shutdown(wait=False)
                state.stop.clear()
                state.freed.clear()

    async def flush_results(self, timeout_s: float) -> int:
        """Write the results already returned but not yet written, within `timeout_s`
        (a host stopping at once); returns how many were still unwritten after it."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settlement.drain(), timeout_s)
        return self._settlement.pending

    def _report(self, exc: BaseException, info: dict[str, Any]) -> None:
        if self.on_error is None:
            # Without a hook these errors were dropped: a worker whose every claim
            # failed looked idle. Logged instead, each kind rate-limited.
            phase = info.get("phase", "?")
            held_back = self._unreported.admit((phase, type(exc)))
            if held_back is not None:
                more = f" ({held_back} more like it since, not logged)" if held_back else ""
                log.warning(
                    "worker %s: %s failed: %s: %s%s (set Worker(on_error=...) to handle these)",
                    self.worker_id, phase, type(exc).__name__, exc, more,
                    exc_info=(type(exc), exc, exc.__traceback__),
                )  # fmt: skip
            return
        with contextlib.suppress(BaseException):
            self.on_error(exc, info)


_ABANDONED_THREAD_HEADROOM = 32


def _checked_queues(queues: Any) -> list[str]:
    """`queues` as a list: each a name a submit could have put a task under."""
    if isinstance(queues, str):
        queues = [queues]
    elif isinstance(queues, bytes | bytearray | memoryview) or not isinstance(queues, Iterable):
        # bytes iterate as integers, and nothing else is a list of names.
        raise ValueError(
            f"queues must be a queue name or a sequence of queue names, got {shown(queues)}"
        )
    names = list(queues)
    if not names:
        raise ValueError("queues must name at least one queue")
    for i, queue in enumerate(names):
        require_str(queue, f"queues[{i}]", max_bytes=MAX_TEXT_BYTES)
    return names


def _check_count(value: Any, arg: str) -> int:
    check_positive(value, arg)  # worded as the SDK words it
    return require_int(value, arg, maximum=MAX_WORKER_COUNT)


def _run_slots(concurrency: Any, default: int) -> int:
    """The call slots of one `run()`: the override, or the worker's own."""
    if concurrency is None:
        return default
    # Types and size are checked as the constructor checks them, but 0 or less is raised
    # to 1 rather than refused, as the protocol says (docs/protocol.md#clamp-concurrency).
    return max(1, require_int(concurrency, "concurrency", maximum=MAX_WORKER_COUNT))


def _checked_resources(resources: Any) -> dict[str, int]:
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise ValueError(
            f"resources must be a mapping of resource name to capacity, got {shown(resources)}"
        )
    checked: dict[str, int] = {}
    for res, capacity in resources.items():
        if not isinstance(res, str) or not res:
            raise ValueError(f"resources keys must be non-empty strings, got {shown(res)}")
        checked[res] = _check_count(capacity, f"resources[{res!r}]")
    return checked


def _check_cancel_grace(value: Any) -> None:
    # NaN and infinity passed the cancel watch's `value < 0`: a NaN grace never ends,
    # so a canceled handler was never stopped.
    require_number(
        value, "cancel_grace", minimum=0, maximum=MAX_CANCEL_GRACE_S, what="a number of seconds"
    )


def _check_task_name(name: Any) -> None:
    # The rule a submit applies to names: under any other name no task can ever
    # exist, so the handler would never run.
    require_str(name, "task name", max_bytes=MAX_TEXT_BYTES)
