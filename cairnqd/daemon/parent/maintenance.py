"""The parent's database thread: one thread, one asyncio loop, one store opened inside
it, so the supervisor's loop never waits on the database. It runs the duties of
handback.py (first, whenever queued), reaper.py, purge.py and the probe of outage.py,
each when due; a duty's failure is counted and reported, and the loop goes on.
Stopping is bounded even mid-outage: queued hand-backs get half of `stop()`'s time,
then the call in flight is cancelled."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from cairnqd.config import Config
from cairnqd.daemon.parent import handback, reaper
from cairnqd.daemon.parent.dbthread import LoopThread
from cairnqd.daemon.parent.handback import HAND_BACK_REASONS, HandBack, Job, JobQueue
from cairnqd.daemon.parent.membership import Membership
from cairnqd.daemon.parent.outage import PROBE_INTERVAL_S, OutageWatch
from cairnqd.daemon.parent.purge import PURGE_LOCK_ID, Purge
from cairnqd.store.base import Row, TaskStore
from cairnqd.store.lazy import LazyStore
from cairnqd.store.tables.fleet import BEAT_S

if TYPE_CHECKING:
    from cairnqd.daemon.parent.metrics import Metrics

__all__ = ["HAND_BACK_REASONS", "PURGE_LOCK_ID", "Maintenance"]

log = logging.getLogger("cairnqd.maintenance")

#: How often the claims running outside a limit are looked for and noted: a task of an
#: SDK worker that runs at least this long is seen (docs/limits.md).
BYPASS_WATCH_S = 5.0


class Maintenance:
    """The parent's maintenance thread; see the module docstring.

    The duties are plain coroutines (`reap_once`, `purge_once`, `release_worker`,
    `fail_max_run`) that tests may await directly on their own loop; `start()` runs
    them on a thread of their own.
    """

    def __init__(
        self,
        config: Config,
        metrics: Metrics,
        *,
        store_factory: Callable[[], TaskStore] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        version: str = "unknown",
    ) -> None:
        self._config = config
        self._metrics = metrics
        # Opened lazily on the loop that first needs it: the maintenance thread's, or
        # a test's when a duty is awaited directly. A failed connect is retried next use.
        self._store = LazyStore(store_factory or (lambda: reaper.reaper_store(config)))
        self._clock = clock
        self._jobs = JobQueue(clock)
        self._stopping = threading.Event()
        #: Set when `stop` cut the loop's database calls short: the database is out of
        #: reach, so what is left to do there is dropped rather than tried.
        self._cut = threading.Event()
        self._purge_paused = threading.Event()
        self._outage = OutageWatch(config.database.path, metrics, clock)
        self._purge = Purge(
            lambda: self._config,
            metrics,
            halted=self._purge_halted,
            between_batches=self.run_urgent,
            wall_clock=wall_clock,
        )
        self.membership = Membership(lambda: self._config, version)
        self._thread = LoopThread("cairnqd-maintenance")
        self._serving: concurrent.futures.Future[None] | None = None
        self._wake: asyncio.Event | None = None
        self._next_reap = 0.0
        self._next_purge = 0.0
        self._next_probe = 0.0
        self._next_beat = 0.0
        self._next_bypass_watch = 0.0

    # -- control, from any thread ----------------------------------------------------------

    def start(self) -> None:
        """Start the thread: reaper now, first purge one interval from now. Idempotent."""
        if self._serving is not None and not self._serving.done():
            return
        self._outage.remember_file()
        self._stopping.clear()
        self._cut.clear()
        self._thread.start()
        self._serving = self._thread.submit(self._serve())

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Finish queued hand-backs, close the store and end the thread. Idempotent.

        False if that took longer than `timeout_s` (the thread is a daemon and is left
        to finish on its own)."""
        serving = self._serving
        if serving is None:
            if self.pending_jobs():
                log.warning(
                    "maintenance never started: %d queued job(s) dropped", self.pending_jobs()
                )
            return True
        deadline = time.monotonic() + timeout_s
        self._stopping.set()
        self._thread.call_soon(self._set_wake)
        # Half the time for queued hand-backs; a call stuck on a silent database is
        # then cut short (`TaskStore.sever`), so stopping stays bounded, and whatever
        # still runs a moment later is cancelled. What it had left to do there is
        # dropped (`_cut`).
        clean = self._thread.finish_or_cut(
            serving, timeout_s / 2, self._cut_short, "maintenance", log
        )
        stopped = self._thread.stop(deadline - time.monotonic())
        if not stopped:
            log.warning("maintenance thread did not end within %.1fs; leaving it", timeout_s)
        self._serving = None
        return clean and stopped

    def hand_back(
        self,
        worker_id: str,
        reason: str,
        unstarted: Sequence[tuple[str, int]] = (),
        interrupted: Sequence[tuple[str, int]] = (),
        why: str | None = None,
    ) -> None:
        """Queue the release of every task `worker_id` still holds, ahead of all other
        maintenance. Only for a worker whose process has been reaped. `unstarted`
        (task id, attempt) pairs get back the attempt their claim spent; `interrupted`
        ones, started tasks an operator's stop cut short, get theirs back up to a cap
        (interruptions.py)."""
        if reason not in HAND_BACK_REASONS:
            raise ValueError(f"reason must be one of {', '.join(HAND_BACK_REASONS)}")
        self._enqueue(
            HandBack(worker_id, reason, tuple(unstarted), interrupted=tuple(interrupted), why=why)
        )

    def fail_task_max_run(
        self, task_id: str, worker_id: str, max_run_s: float, delay_ms: int = 0
    ) -> None:
        """Queue failing `task_id` as `max_run_exceeded` under its dead worker, retried
        after `delay_ms`. Queue it before that worker's hand-back: jobs run in order, so
        the overrun task is failed and the hand-back then releases the rest."""
        self._enqueue(handback.MaxRunFailure(task_id, worker_id, max_run_s, delay_ms))

    def pause_purge(self) -> None:
        """No new sweep, and a sweep in progress stops after its current batch (drain)."""
        self._purge_paused.set()

    def reconfigure(self, config: Config) -> None:
        """Apply parent-hot `retention.*` and `reaper.*`: rules and batch sizes from the
        next sweep, new intervals once the current wait has run out. A reload also ends
        the operator's overrides of the config's limits (`cairnqd limits set`)."""
        self._config = config
        if config.limits:
            self._enqueue(handback.ClearLimitOverrides(tuple(config.limits)))
        self._thread.call_soon(self._set_wake)

    def database_problem(self) -> str | None:
        """A lost database file, else the outage under way, else what went wrong with
        the last duty if it failed (read from any thread)."""
        return self._outage.database_problem()

    def database_down_s(self) -> float:
        """Seconds the database has not answered the parent; 0 while it does."""
        return self._outage.down_s()

    def _cut_short(self) -> None:
        """On the loop, at a stop that cannot wait: drop what is left, sever the calls."""
        self._cut.set()
        self._store.sever()

    def pending_jobs(self) -> int:
        return len(self._jobs)

    def _enqueue(self, job: Job) -> None:
        if self._stopping.is_set() and self._serving is None:
            log.warning("maintenance is stopped: %s dropped; leases will expire", job.describe())
            return
        self._jobs.put(job)
        self._thread.call_soon(self._set_wake)

    def _set_wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- the loop ----------------------------------------------------------------------------

    async def _serve(self) -> None:
        self._wake = asyncio.Event()
        started = self._clock()
        self._next_reap = self._next_probe = self._next_beat = started
        self._next_bypass_watch = started
        self._next_purge = started + self._config.retention.interval.total_seconds()
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                await self.run_urgent()
                await self._run_due_duties()
                await self._sleep_until_due()
            # Shutdown hands back the children it had to kill: those jobs matter most,
            # unless the stop had to cut the database calls short.
            if not self._cut.is_set():
                await self.run_urgent()
        finally:
            if self._cut.is_set() and self.pending_jobs():
                log.warning(
                    "maintenance stopped with the database out of reach: %d job(s) dropped "
                    "(their tasks run again once their leases expire)",
                    self._jobs.drop_all(),
                )
            await self.aclose()

    async def _run_due_duties(self) -> None:
        now = self._clock()
        if self._outage.file_lost():
            # Nothing more to do on that file; look again (and wake) once per probe.
            self._next_reap = self._next_purge = self._next_probe = now + PROBE_INTERVAL_S
            self._next_beat = self._next_bypass_watch = self._next_probe
            return
        retention, reaper_config = self._config.retention, self._config.reaper
        if now >= self._next_reap and not self._stopping.is_set():
            self._next_reap = now + reaper_config.interval.total_seconds()
            await self._tick("reaper", self.reap_once)
        if now >= self._next_purge and not self._purge_halted():
            self._next_purge = now + retention.interval.total_seconds()
            await self._tick("purge", self.purge_turn)
        if self._clock() >= self._next_probe and not self._stopping.is_set():
            await self._tick("probe", self.probe_once)
            self._next_probe = self._clock() + PROBE_INTERVAL_S
        if self._clock() >= self._next_beat and not self._stopping.is_set():
            self._next_beat = self._clock() + BEAT_S
            await self._tick("fleet", self.fleet_beat)
        if self._clock() >= self._next_bypass_watch and not self._stopping.is_set():
            self._next_bypass_watch = self._clock() + BYPASS_WATCH_S
            if self._config.limits:
                await self._tick("limits", self.note_limit_bypasses)

    async def _sleep_until_due(self) -> None:
        assert self._wake is not None
        due = min(
            self._next_reap,
            self._next_purge,
            self._next_probe,
            self._next_beat,
            self._next_bypass_watch,
        )
        if self.pending_jobs():
            due = min(due, self._jobs.retry_at)
        timeout = max(0.0, due - self._clock())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _tick(self, duty: str, run: Callable[[], Coroutine[Any, Any, object]]) -> None:
        # The one broad except per tick: report, count, and let the loop go on.
        began = self._clock()
        try:
            await run()
        except Exception as exc:
            # A statement on a SQLite file deleted or replaced meanwhile fails with
            # "disk I/O error": that is the loss (logged once, in /healthz), not an
            # outage to retry quietly.
            if self._outage.file_lost():
                return
            self._outage.failed(exc, duty, began)
        else:
            self._outage.answered()

    def _purge_halted(self) -> bool:
        return self._stopping.is_set() or self._purge_paused.is_set()

    async def run_urgent(self) -> None:
        """Run queued hand-backs (and max_run failures) in order, now."""
        while (job := self._jobs.next(stopping=self._stopping.is_set())) is not None:
            began = self._clock()
            try:
                if isinstance(job, HandBack):
                    await self.release_worker(
                        job.worker_id, job.reason, job.unstarted, job.interrupted, why=job.why
                    )
                elif isinstance(job, handback.ClearLimitOverrides):
                    await self.clear_limit_overrides(job.names)
                else:
                    await self.fail_max_run(job.task_id, job.worker_id, job.max_run_s, job.delay_ms)
                self._outage.answered()
            except asyncio.CancelledError:
                if self._cut.is_set():
                    self._jobs.put_back(job)  # counted with the dropped ones
                raise
            except Exception as exc:
                if self._cut.is_set():
                    # The stop cut its call short: dropped with the jobs still queued
                    # (said once, by `_serve`), not a failure of its own.
                    self._jobs.put_back(job)
                    return
                self._outage.failed(exc, job.describe(), began)
                if self._jobs.retry_later(job, stopping=self._stopping.is_set()):
                    return  # it waits for its backoff; the loop wakes for it

    # -- duties (awaitable directly in tests) ------------------------------------------------

    async def release_worker(
        self,
        worker_id: str,
        reason: str,
        unstarted: Sequence[tuple[str, int]] = (),
        interrupted: Sequence[tuple[str, int]] = (),
        why: str | None = None,
    ) -> list[Row]:
        """Hand back every task `worker_id` holds now (handback.py)."""
        store = await self._store.get()
        return await handback.release_worker(
            store, self._metrics, worker_id, reason, unstarted, interrupted, why
        )

    async def clear_limit_overrides(self, names: Sequence[str]) -> list[str]:
        """End the operator's overrides of `names` (`cairnqd limits set`)."""
        store = await self._store.get()
        cleared = await store.limit_table.clear(names)
        for name in cleared:
            log.info("limit %s: the reload ends the operator's override; back to the config", name)
        return cleared

    async def note_limit_bypasses(self) -> int:
        """Note the tasks running outside the config's limits now, so that warnings
        name their workers for an hour (`LimitTable.note_bypasses`)."""
        store = await self._store.get()
        return await store.limit_table.note_bypasses(self._config.flow_limits())

    async def fail_max_run(
        self, task_id: str, worker_id: str, max_run_s: float, delay_ms: int = 0
    ) -> bool:
        """Fail an overrun attempt (handback.py); False if no longer that worker's."""
        store = await self._store.get()
        return await handback.fail_max_run(
            store, self._metrics, task_id, worker_id, max_run_s, delay_ms
        )

    async def probe_once(self) -> None:
        """One round trip: does the database answer?"""
        await self._outage.probe(await self._store.get())

    async def reap_once(self) -> int:
        """Recover every expired lease now; how many tasks were recovered."""
        return await reaper.reap(await self._store.get(), self._metrics)

    async def purge_turn(self) -> int | None:
        """The scheduled sweep, if this host takes the purge's turn (purge.py)."""
        if not self._config.retention.rules or self._purge_halted():
            return None
        return await self._purge.turn(await self._store.get())

    async def purge_once(self) -> int | None:
        """One sweep over every rule now (purge.py); None when it did not run."""
        if not self._config.retention.rules or self._purge_halted():
            return None
        return await self._purge.sweep(await self._store.get())

    async def fleet_beat(self) -> None:
        """Join the fleet registry, or stamp this daemon's row (membership.py)."""
        await self.membership.beat(await self._store.get())

    async def aclose(self) -> None:
        """Leave the fleet and close the store (done by `stop()`; call it after awaiting
        duties directly)."""
        if self._store.opened and not self._outage.file_lost() and not self._cut.is_set():
            try:
                async with asyncio.timeout(2.0):
                    await self.membership.leave(await self._store.get())
            except Exception as exc:  # the row goes silent and ages out instead
                log.warning("could not mark this daemon stopped in the fleet: %s", exc)
        with contextlib.suppress(Exception):  # a broken connection may fail to close
            await self._store.close()
