"""The parent's database duties: hand-backs, the lease reaper and the purge scheduler.

Design note. The supervisor's loop must never wait on the
database, so every write the parent makes runs here: one thread, one asyncio loop, one
store opened inside that thread (a connection never crosses threads or a fork).

- **Hand-backs jump the queue.** `hand_back()` may be called from any thread; it
  queues the job and wakes the loop. Urgent jobs run before any due duty and between
  purge batches, so a dead child's tasks are claimable within milliseconds even while
  a long sweep is in progress.
- **Reaper**: once at start, then every `reaper.interval`. Every host runs it: the
  protocol's `recover_leases` skips rows another recoverer holds.
- **Purge**: the first sweep one `retention.interval` after start, never at boot (a
  daemon restarting in a loop must not hammer the database). Per rule, bounded
  batches until one comes back short or `max_batches` is reached; the rest waits for
  the next interval. SQLite pauses between batches so workers get the write lock, and
  checkpoints the WAL after a sweep that deleted rows; Postgres, when autovacuum is off,
  starts a VACUUM in the background then (store/postgres/store.py `after_purge`), which the
  loop does not wait for. On Postgres one host sweeps per
  interval: each host's due sweep first asks for the purge's turn, a row in
  `cairnqd_leases` that one host takes and no host can take again before an interval
  has passed (so two hosts never sweep back to back), then for the purge lock
  (`pg_try_advisory_lock(lock_namespace, 1)`, or a lease row behind a transaction
  pooler without `direct_dsn`), so sweeps never overlap; the others skip.
- **Probe**: every `PROBE_INTERVAL_S` a one-row round trip, so the parent knows
  whether the database answers even between duties. Every call here is bounded
  (`DAEMON_CALL_TIMEOUT_S`), so a silent partition fails a call within the detection
  bound stated in store/postgres/connect.py (30 s).
- **Errors** are caught per tick, counted as `cairnq_db_errors_total{component=
  "maintenance"}` and logged; the loop goes on. A failed hand-back is retried with
  backoff: giving up only means its tasks wait for their leases to expire.
- **Outages**: a call that fails for want of an answer (timeout, lost connection)
  starts an outage. It is logged once, as `database unreachable`, reported by
  `database_problem()` (/healthz) until a call succeeds again, and its end is logged
  once, as `database reachable again after N s`; the retries in between are quiet.
- **The SQLite file**: the parent opens it with `mode=rw` (never creating it), and each
  probe checks that the path still names the file it opened. Deleted or replaced, it is
  logged once as CRITICAL, reported by `database_problem()`, and every duty stops: the
  parent must not create or migrate a fresh file under children still on the old one.
- **Stopping** is bounded even mid-outage: queued hand-backs get half of `stop()`'s
  time, then the call in flight is cancelled (its connection dropped).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cairnqd.config import Config, PurgeRule, to_ms
from cairnqd.daemon.parent.dbthread import LoopThread
from cairnqd.daemon.parent.parent_store import db_error_kind, parent_store
from cairnqd.errors import LostLease
from cairnqd.store.base import Row, TaskStore
from cairnqd.store.lazy import LazyStore
from cairnqd.store.reachability import Reachability, is_unreachable
from cairnqd.store.sqlite.files import DatabaseFile, file_id, is_plain_file

if TYPE_CHECKING:
    from cairnqd.daemon.parent.metrics import Metrics

__all__ = ["HAND_BACK_REASONS", "PURGE_LOCK_ID", "Maintenance"]

log = logging.getLogger("cairnqd.maintenance")

HAND_BACK_REASONS = ("worker_exit", "shutdown", "max_run")
#: How often the parent checks that the database answers, between duties.
PROBE_INTERVAL_S = 2.0
#: Second key of the purge lock; the stats leader uses 2 (metrics/database.py).
PURGE_LOCK_ID = 1
_HAND_BACK_ATTEMPTS = 5
_HAND_BACK_BACKOFF_MAX_S = 8.0
# The lease-expired envelope's message names why the parent let go of the task.
_HAND_BACK_CAUSES = {
    "worker_exit": "its worker process exited",
    "shutdown": "the daemon shut down before it finished",
    "max_run": "its worker was stopped for exceeding max_run",
}


def _reaper_store(config: Config) -> TaskStore:
    """The maintenance thread's store. On SQLite it rides out a forward step of the wall
    clock for as long as the longest lease of the config's groups (store/clockstep.py),
    so the reaper takes no live lease for expired before its worker renewed it."""
    store = parent_store(config.database)
    if store.clock_watch is not None:
        leases = [group.lease.total_seconds() for group in config.groups.values()]
        store.clock_watch.at_least(max(leases, default=0.0))
    return store


# -- the maintenance thread ----------------------------------------------------------------


@dataclass
class _HandBack:
    worker_id: str
    reason: str
    #: (task id, attempt) of the tasks it held and never started.
    unstarted: tuple[tuple[str, int], ...] = ()
    attempts: int = 0

    def describe(self) -> str:
        return f"hand-back of {self.worker_id} ({self.reason})"


@dataclass
class _MaxRunFailure:
    task_id: str
    worker_id: str
    max_run_s: float
    #: The retry delay, from the group's backoff settings.
    delay_ms: int = 0
    attempts: int = 0

    def describe(self) -> str:
        return f"max_run failure of task {self.task_id}"


_Job = _HandBack | _MaxRunFailure


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
    ) -> None:
        self._config = config
        self._metrics = metrics
        # Opened lazily on the loop that first needs it: the maintenance thread's, or
        # a test's when a duty is awaited directly. A failed connect is retried next use.
        self._store = LazyStore(store_factory or (lambda: _reaper_store(config)))
        self._clock = clock
        self._wall_clock = wall_clock
        self._jobs: collections.deque[_Job] = collections.deque()
        self._jobs_lock = threading.Lock()
        self._retry_at = 0.0
        self._stopping = threading.Event()
        self._purge_paused = threading.Event()
        # The last duty's failure, until one succeeds: /healthz reports it.
        self._problem: str | None = None
        self._reach = Reachability(clock)
        path = config.database.path
        self._file = DatabaseFile(path) if path is not None and is_plain_file(path) else None
        # When the outage now logged began; None while none is.
        self._outage_logged: float | None = None
        self._thread = LoopThread("cairnqd-maintenance")
        self._serving: concurrent.futures.Future[None] | None = None
        self._wake: asyncio.Event | None = None
        self._next_reap = 0.0
        self._next_purge = 0.0
        self._next_probe = 0.0

    # -- control, from any thread ----------------------------------------------------------

    def start(self) -> None:
        """Start the thread: reaper now, first purge one interval from now. Idempotent."""
        if self._serving is not None and not self._serving.done():
            return
        if self._file is not None and file_id(self._file.path) is not None:
            # The file the supervisor made sure of a moment ago is the one to watch.
            self._file.remember()
        self._stopping.clear()
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
        clean = True
        try:
            # Half the time for queued hand-backs; a call stuck on a silent database
            # is then cancelled, which drops its connection, so stopping stays bounded.
            serving.result(timeout=timeout_s / 2)
        except TimeoutError:
            log.warning("maintenance still busy after %.1fs; cancelling it", timeout_s / 2)
            clean = False
            serving.cancel()
        except concurrent.futures.CancelledError:
            pass
        except Exception:
            log.exception("maintenance thread failed")
        stopped = self._thread.stop(deadline - time.monotonic())
        if not stopped:
            log.warning("maintenance thread did not end within %.1fs; leaving it", timeout_s)
        self._serving = None
        return clean and stopped

    def hand_back(
        self, worker_id: str, reason: str, unstarted: Sequence[tuple[str, int]] = ()
    ) -> None:
        """Queue the release of every task `worker_id` still holds, ahead of all other
        maintenance. Only for a worker whose process has been reaped. `unstarted`
        (task id, attempt) pairs get back the attempt their claim spent."""
        if reason not in HAND_BACK_REASONS:
            raise ValueError(f"reason must be one of {', '.join(HAND_BACK_REASONS)}")
        self._enqueue(_HandBack(worker_id, reason, tuple(unstarted)))

    def fail_task_max_run(
        self, task_id: str, worker_id: str, max_run_s: float, delay_ms: int = 0
    ) -> None:
        """Queue failing `task_id` as `max_run_exceeded` under its dead worker, retried
        after `delay_ms`. Queue it before that worker's hand-back: jobs run in order, so
        the overrun task is failed and the hand-back then releases the rest."""
        self._enqueue(_MaxRunFailure(task_id, worker_id, max_run_s, delay_ms))

    def pause_purge(self) -> None:
        """No new sweep, and a sweep in progress stops after its current batch (drain)."""
        self._purge_paused.set()

    def reconfigure(self, config: Config) -> None:
        """Apply parent-hot `retention.*` and `reaper.*`: rules and batch sizes from the
        next sweep, new intervals once the current wait has run out."""
        self._config = config
        self._thread.call_soon(self._set_wake)

    def database_problem(self) -> str | None:
        """A lost database file, else the outage under way, else what went wrong with
        the last duty if it failed (read from any thread)."""
        if self._file is not None and self._file.lost is not None:
            return f"{self._file.lost}; workers stopped claiming: restore it and restart cairnqd"
        if self._reach.down_since is not None:
            return f"database unreachable for {self._reach.down_for():.0f}s: {self._reach.error}"
        return self._problem

    def database_down_s(self) -> float:
        """Seconds the database has not answered the parent; 0 while it does."""
        return self._reach.down_for()

    def pending_jobs(self) -> int:
        with self._jobs_lock:
            return len(self._jobs)

    def _enqueue(self, job: _Job) -> None:
        if self._stopping.is_set() and self._serving is None:
            log.warning("maintenance is stopped: %s dropped; leases will expire", job.describe())
            return
        with self._jobs_lock:
            self._jobs.append(job)
        self._thread.call_soon(self._set_wake)

    def _set_wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- the loop ----------------------------------------------------------------------------

    async def _serve(self) -> None:
        self._wake = asyncio.Event()
        started = self._clock()
        self._next_reap = self._next_probe = started
        self._next_purge = started + self._config.retention.interval.total_seconds()
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                await self.run_urgent()
                await self._run_due_duties()
                await self._sleep_until_due()
            # Shutdown hands back the children it had to kill: those jobs matter most.
            await self.run_urgent()
        finally:
            await self.aclose()

    async def _run_due_duties(self) -> None:
        now = self._clock()
        if self._file_lost():
            # Nothing more to do on that file; look again (and wake) once per probe.
            self._next_reap = self._next_purge = self._next_probe = now + PROBE_INTERVAL_S
            return
        retention, reaper = self._config.retention, self._config.reaper
        if now >= self._next_reap and not self._stopping.is_set():
            self._next_reap = now + reaper.interval.total_seconds()
            await self._tick("reaper", self.reap_once)
        if now >= self._next_purge and not self._purge_halted():
            self._next_purge = now + retention.interval.total_seconds()
            await self._tick("purge", self.purge_turn)
        if self._clock() >= self._next_probe and not self._stopping.is_set():
            await self._tick("probe", self.probe_once)
            self._next_probe = self._clock() + PROBE_INTERVAL_S

    async def _sleep_until_due(self) -> None:
        assert self._wake is not None
        due = min(self._next_reap, self._next_purge, self._next_probe)
        if self.pending_jobs():
            due = min(due, self._retry_at)
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
            if self._file_lost():
                return
            self._count_db_error(exc, duty, began)
        else:
            self._answered()

    def _file_lost(self) -> bool:
        """Whether the SQLite file was deleted or replaced (logged once, when found)."""
        if self._file is None:
            return False
        known = self._file.lost
        lost = self._file.check()
        if lost is not None and known is None:
            log.critical(
                "%s; the daemon no longer runs maintenance on it and its workers stop "
                "claiming; restore the file and restart cairnqd",
                lost,
            )
        return lost is not None

    def _answered(self) -> None:
        self._problem = None
        self._reach.succeeded()
        if self._outage_logged is not None:
            log.info(
                "database reachable again after %.0fs",
                self._clock() - self._outage_logged,
            )
            self._outage_logged = None

    def _count_db_error(self, exc: BaseException, what: str, began: float | None = None) -> None:
        kind = db_error_kind(exc)
        self._metrics.db_error("maintenance", kind)
        self._problem = f"maintenance: {what} failed ({kind}): {exc or type(exc).__name__}"
        if not is_unreachable(exc):
            log.warning("%s failed (%s): %s", what, kind, exc or type(exc).__name__)
            return
        self._reach.failed(exc, since=began)
        if self._outage_logged is None and self._reach.down_since is not None:
            self._outage_logged = self._reach.down_since
            log.warning(
                "database unreachable (%s failed: %s); retrying quietly, work resumes "
                "by itself once it answers",
                what, self._reach.error,
            )  # fmt: skip
        else:
            log.debug("%s failed (%s): %s", what, kind, exc or type(exc).__name__)

    def _purge_halted(self) -> bool:
        return self._stopping.is_set() or self._purge_paused.is_set()

    # -- urgent jobs ---------------------------------------------------------------------------

    async def run_urgent(self) -> None:
        """Run queued hand-backs (and max_run failures) in order, now."""
        while (job := self._next_job()) is not None:
            began = self._clock()
            try:
                await self._run_job(job)
                self._answered()
            except Exception as exc:
                self._count_db_error(exc, job.describe(), began)
                if self._requeue(job):
                    return  # it waits for its backoff; the loop wakes for it

    def _next_job(self) -> _Job | None:
        with self._jobs_lock:
            if not self._jobs:
                return None
            # A failed job waits at the head for its backoff; stopping tries it once more.
            if self._clock() < self._retry_at and not self._stopping.is_set():
                return None
            return self._jobs.popleft()

    async def _run_job(self, job: _Job) -> None:
        if isinstance(job, _HandBack):
            await self.release_worker(job.worker_id, job.reason, job.unstarted)
        else:
            await self.fail_max_run(job.task_id, job.worker_id, job.max_run_s, job.delay_ms)

    def _requeue(self, job: _Job) -> bool:
        """Put a failed job back at the head, due after a backoff. False when it is
        dropped instead (out of attempts, or stopping): its leases will expire."""
        job.attempts += 1
        if job.attempts >= _HAND_BACK_ATTEMPTS or self._stopping.is_set():
            log.error("giving up on %s; its tasks recover when their leases expire", job.describe())
            return False
        with self._jobs_lock:
            self._jobs.appendleft(job)
        delay = min(_HAND_BACK_BACKOFF_MAX_S, 0.5 * 2 ** (job.attempts - 1))
        self._retry_at = self._clock() + delay
        return True

    # -- duties (awaitable directly in tests) ------------------------------------------------

    async def release_worker(
        self, worker_id: str, reason: str, unstarted: Sequence[tuple[str, int]] = ()
    ) -> list[Row]:
        """Hand back every task `worker_id` holds, with recovery's outcomes, now; the
        `unstarted` ones with their attempt given back."""
        store = await self._store.get()
        message = (
            f"task lease released and max attempts reached: {_HAND_BACK_CAUSES[reason]} ({reason})"
        )
        rows = await store.release_worker(worker_id, message=message, unstarted=unstarted)
        self._count_recoveries(rows, reason)
        if rows:
            outcomes = Counter(str(r["status"]) for r in rows)
            summary = ", ".join(f"{status} {n}" for status, n in sorted(outcomes.items()))
            spared = (
                f"; {len(unstarted)} not started or with an unwritten result kept their attempt"
                if unstarted
                else ""
            )
            log.info(
                "handed back %d task(s) of %s (%s): %s%s",
                len(rows), worker_id, reason, summary, spared,
            )  # fmt: skip
        return rows

    async def fail_max_run(
        self, task_id: str, worker_id: str, max_run_s: float, delay_ms: int = 0
    ) -> bool:
        """Fail an overrun attempt (retryable after `delay_ms`; cancel-wins and
        max_attempts apply). False if the task was no longer that worker's."""
        store = await self._store.get()
        error = {
            "type": "MaxRunExceeded",
            "code": "max_run_exceeded",
            "message": f"attempt ran longer than max_run ({max_run_s:g}s); its worker was killed",
            "retryable": True,
            "details": {"max_run_s": max_run_s},
        }
        try:
            task = await store.fail(
                task_id=task_id, worker_id=worker_id, error=error, delay_ms=delay_ms
            )
        except LostLease:
            return False
        self._metrics.lease_recoveries(task.queue, "max_run", 1)
        log.info("failed task %s after max_run (now %s)", task_id, task.status)
        return True

    async def probe_once(self) -> None:
        """One round trip: does the database answer?"""
        store = await self._store.get()
        if self._file is not None:
            self._file.remember()  # the file this store opened (once)
        await store.protocol_version()

    async def reap_once(self) -> int:
        """Recover every expired lease now; returns how many tasks were recovered."""
        store = await self._store.get()
        rows = await store.recover_leases()
        self._count_recoveries(rows, "expired")
        if rows:
            log.info("recovered %d task(s) with expired leases", len(rows))
        return len(rows)

    def _count_recoveries(self, rows: list[Row], reason: str) -> None:
        for queue, n in Counter(str(r["queue"]) for r in rows).items():
            self._metrics.lease_recoveries(queue, reason, n)

    async def purge_turn(self) -> int | None:
        """The scheduled sweep: `purge_once` if this host takes the purge's turn, which
        one host per `retention.interval` gets across every host on the database."""
        if not self._config.retention.rules or self._purge_halted():
            return None
        store = await self._store.get()
        interval_ms = to_ms(self._config.retention.interval)
        # A little short of the interval, so the sweeping host's own next tick (timed
        # on its clock, checked on the database's) finds its turn due again.
        every_ms = interval_ms - min(1000, interval_ms // 10)
        if not await store.leadership.take_turn(
            f"purge:{self._config.database.lock_namespace}", every_ms
        ):
            log.debug("another host purged within this interval; skipping this one")
            return None
        return await self.purge_once()

    async def purge_once(self) -> int | None:
        """One sweep over every rule; rows deleted, or None when it did not run (no
        rules, paused or stopping, or another host holds the purge lock)."""
        rules = self._config.retention.rules
        if not rules or self._purge_halted():
            return None
        store = await self._store.get()
        async with self._sweep_lock(store) as held:
            if not held:
                log.debug("another host is purging; skipping this interval")
                return None
            return await self._sweep(store, rules)

    async def _sweep(self, store: TaskStore, rules: tuple[PurgeRule, ...]) -> int:
        self._metrics.purge_started()
        deleted = 0
        try:
            for index, rule in enumerate(rules):
                deleted += await self._purge_rule(store, index, rule)
            if deleted:
                await store.after_purge()
        except Exception:
            self._metrics.purge_failed()
            raise
        if self._purge_halted():
            log.info("purge sweep interrupted after deleting %d task(s)", deleted)
            return deleted
        self._metrics.purge_succeeded(self._wall_clock())
        if deleted:
            log.info("purge sweep deleted %d task(s)", deleted)
        return deleted

    async def _purge_rule(self, store: TaskStore, index: int, rule: PurgeRule) -> int:
        retention = self._config.retention
        deleted = 0
        for batch_no in range(retention.max_batches):
            await self.run_urgent()
            if self._purge_halted():
                break
            if batch_no and store.purge_batch_pause_s:
                # Let the workers' writes in between two of our write transactions.
                await asyncio.sleep(store.purge_batch_pause_s)
            ids = await store.purge(
                older_than_ms=to_ms(rule.older_than),
                queue=rule.queue,
                status=rule.status,
                name=rule.name,
                limit=retention.batch,
            )
            self._metrics.purge_deleted(str(index), len(ids))
            deleted += len(ids)
            if len(ids) < retention.batch:
                break
        return deleted

    @contextlib.asynccontextmanager
    async def _sweep_lock(self, store: TaskStore) -> AsyncIterator[bool]:
        # One host per interval on Postgres; SQLite has one host by construction.
        namespace = self._config.database.lock_namespace
        async with store.leadership.exclusive(namespace, PURGE_LOCK_ID) as held:
            yield held

    # -- the store -------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the store (done by `stop()`; call it after awaiting duties directly)."""
        with contextlib.suppress(Exception):  # a broken connection may fail to close
            await self._store.close()
