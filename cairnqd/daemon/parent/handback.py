"""Hand-backs: a reaped child's tasks released at once (`release_worker`), and an
overrun attempt failed as `max_run_exceeded`. Queued from any thread, run in order
ahead of every other duty; a failed job is retried with backoff, and giving up only
means its tasks wait for their leases to expire."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cairnqd.daemon.parent.interruptions import OPERATOR_RESTORES
from cairnqd.daemon.parent.reaper import count_recoveries
from cairnqd.errors import LostLease
from cairnqd.store.base import Row, TaskStore

if TYPE_CHECKING:
    from cairnqd.daemon.parent.metrics import Metrics

log = logging.getLogger("cairnqd.maintenance")

HAND_BACK_REASONS = ("worker_exit", "shutdown", "max_run")
_ATTEMPTS = 5
_BACKOFF_MAX_S = 8.0
# The lease-expired envelope's message names why the parent let go of the task.
_CAUSES = {
    "worker_exit": "its worker process exited",
    "shutdown": "the daemon shut down before it finished",
    "max_run": "its worker was stopped for exceeding max_run",
}


@dataclass
class HandBack:
    worker_id: str
    reason: str
    #: (task id, attempt) of the tasks it held and never started.
    unstarted: tuple[tuple[str, int], ...] = ()
    attempts: int = 0
    #: (task id, attempt) of the started tasks an operator's stop cut short.
    interrupted: tuple[tuple[str, int], ...] = ()
    #: Why the worker stopped, as the attempt history names it (`stall` for a stalled
    #: loop); None: the reason.
    why: str | None = None

    def describe(self) -> str:
        return f"hand-back of {self.worker_id} ({self.reason})"


@dataclass
class MaxRunFailure:
    task_id: str
    worker_id: str
    max_run_s: float
    #: The retry delay, from the group's backoff settings.
    delay_ms: int = 0
    attempts: int = 0

    def describe(self) -> str:
        return f"max_run failure of task {self.task_id}"


@dataclass
class ClearLimitOverrides:
    """A reload of the config: the operator's overrides of its limits end (docs/limits.md)."""

    names: tuple[str, ...]
    attempts: int = 0

    def describe(self) -> str:
        return f"clearing the overrides of limits {', '.join(self.names)}"


Job = HandBack | MaxRunFailure | ClearLimitOverrides


class JobQueue:
    """Hand-back jobs in order, a failed one waiting at the head for its backoff."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._jobs: deque[Job] = deque()
        self._lock = threading.Lock()
        #: When the job at the head may be tried again.
        self.retry_at = 0.0

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)

    def put(self, job: Job) -> None:
        with self._lock:
            self._jobs.append(job)

    def next(self, *, stopping: bool) -> Job | None:
        with self._lock:
            if not self._jobs:
                return None
            # A failed job waits at the head for its backoff; stopping tries it once more.
            if self._clock() < self.retry_at and not stopping:
                return None
            return self._jobs.popleft()

    def drop_all(self) -> int:
        """Forget every queued job; how many there were."""
        with self._lock:
            dropped = len(self._jobs)
            self._jobs.clear()
        return dropped

    def put_back(self, job: Job) -> None:
        """Return `job` to the head of the queue as it was, untried."""
        with self._lock:
            self._jobs.appendleft(job)

    def retry_later(self, job: Job, *, stopping: bool) -> bool:
        """Put a failed job back at the head, due after a backoff. False when it is
        dropped instead (out of attempts, or stopping): its leases will expire."""
        job.attempts += 1
        if job.attempts >= _ATTEMPTS or stopping:
            log.error("giving up on %s; its tasks recover when their leases expire", job.describe())
            return False
        with self._lock:
            self._jobs.appendleft(job)
        self.retry_at = self._clock() + min(_BACKOFF_MAX_S, 0.5 * 2 ** (job.attempts - 1))
        return True


async def release_worker(
    store: TaskStore,
    metrics: Metrics,
    worker_id: str,
    reason: str,
    unstarted: Sequence[tuple[str, int]] = (),
    interrupted: Sequence[tuple[str, int]] = (),
    why: str | None = None,
) -> list[Row]:
    """Hand back every task `worker_id` holds, with recovery's outcomes, now; the
    `unstarted` ones with their attempt given back, and the `interrupted` ones too up
    to `OPERATOR_RESTORES` times per task (interruptions.py). `why` names the attempts
    in their history (`stall`), the reason when None."""
    message = f"task lease released and max attempts reached: {_CAUSES[reason]} ({reason})"
    rows = await store.release_worker(
        worker_id,
        message=message,
        unstarted=unstarted,
        interrupted=interrupted,
        interruption_cap=OPERATOR_RESTORES,
        why=why or reason,
    )
    count_recoveries(metrics, rows, reason)
    if rows:
        outcomes = Counter(str(r["status"]) for r in rows)
        summary = ", ".join(f"{status} {n}" for status, n in sorted(outcomes.items()))
        spared = (
            f"; {len(unstarted)} not started or with an unwritten result kept their attempt"
            if unstarted
            else ""
        )
        given = [str(r["id"]) for r in rows if r.get("interrupted")]
        if given:
            cut = ", ".join(given)
            spared += f"; {len(given)} cut short by the operator got their attempt back: {cut}"
        log.info(
            "handed back %d task(s) of %s (%s): %s%s",
            len(rows), worker_id, reason, summary, spared,
        )  # fmt: skip
    return rows


async def fail_max_run(
    store: TaskStore,
    metrics: Metrics,
    task_id: str,
    worker_id: str,
    max_run_s: float,
    delay_ms: int = 0,
) -> bool:
    """Fail an overrun attempt (retryable after `delay_ms`; cancel-wins and
    max_attempts apply). False if the task was no longer that worker's."""
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
    metrics.lease_recoveries(task.queue, "max_run", 1)
    log.info("failed task %s after max_run (now %s)", task_id, task.status)
    return True


__all__ = [
    "HAND_BACK_REASONS",
    "HandBack",
    "Job",
    "JobQueue",
    "MaxRunFailure",
    "fail_max_run",
    "release_worker",
]
