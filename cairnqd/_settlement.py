"""Writing outcomes: single-task settlements, and the batcher for returned results.

Failures and `ctx.succeed()` are written one at a time; returned results are queued and
written as `complete_many` by the next claim, within `SETTLE_WAIT_S`
(`PREFETCH_SETTLE_WAIT_S` when claiming ahead), or by a flusher when no claim is coming.
A result is written only while its lease is ours. Refused writes for want of space hold
claims (`space_hold`). Why: docs/architecture.md, "Writing results".
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from cairnqd._failures import cut_message
from cairnqd._inflight import InFlight, LoopState
from cairnqd._jsoncodec import dump_json, load_json
from cairnqd._prefetch import PrefetchSizer
from cairnqd.errors import LostLease, StoreClosed
from cairnqd.models import Task
from cairnqd.store.base import TaskStore
from cairnqd.store.errors import classify, is_transient

if TYPE_CHECKING:
    from cairnqd.context import TaskContext

Pending = tuple["TaskContext", str | None]


def backoff_delay_ms(attempt: int, base_ms: int, max_ms: int, rand: float | None = None) -> int:
    """Capped exponential backoff with equal jitter: uniform in [w/2, w), so a fleet
    retrying at the cap stops moving in lockstep."""
    if base_ms <= 0:
        return 0
    window: int = min(max_ms, base_ms * 2 ** max(0, attempt - 1))
    half = window // 2
    r = random.random() if rand is None else rand
    return half + int(r * (window - half))


def envelope(type_: str, code: str, message: str, *, retryable: bool = False) -> dict[str, Any]:
    return {"type": type_, "code": code, "message": message, "retryable": retryable, "details": {}}


# The text fields every stored envelope has, and what one left out becomes: the values
# a reader falls back to (`ErrorEnvelope.from_stored`).
_TEXT_FIELDS = (("type", "TaskError"), ("code", "task_error"), ("message", "task failed"))

# In JSON text as `dump_json` writes it (ASCII, lowercase escapes), the escapes of what
# Postgres cannot store: a surrogate pair is one character and is kept; every other
# escape is matched whole, so that an escaped backslash is never read as the start of
# an escape.
_UNSTORABLE = re.compile(
    r"\\ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2}"  # a pair: kept
    r"|\\u(d[89a-f][0-9a-f]{2})"  # a lone surrogate
    r"|(\\u0000)"  # NUL
    r"|\\.",  # any other escape: kept
    re.IGNORECASE,
)


def _escape_unstorable(match: re.Match[str]) -> str:
    # As Python writes them with "backslashreplace": a lone surrogate as the six
    # characters `\udXXX`, a NUL as the four characters `\x00` (so a message that held
    # the same characters as text reads the same; a reader cannot tell them apart).
    if match.group(1) is not None:
        return "\\\\u" + match.group(1)
    if match.group(2) is not None:
        return "\\\\x00"
    return match.group(0)


def storable_error(error: Mapping[str, Any], retryable: bool) -> dict[str, Any]:
    """The envelope the worker writes for `error` (docs/protocol.md §4.5): all five
    fields, missing ones as a reader would fill them (`retryable` as the failure is),
    the message cut at `MESSAGE_MAX_CHARS`, and text Postgres cannot store escaped
    (after the cut: an escape makes a character up to six, so the stored message may
    exceed the limit by that much, never by more).

    What the envelope cannot be is refused, naming the part, as a result JSON cannot
    carry is refused by `ctx.succeed`: a field of the wrong type (ValueError), a value
    JSON cannot carry (SerializationError). The worker's own envelopes never are."""
    if not isinstance(error, Mapping):
        raise ValueError(f"error must be a mapping, got {type(error).__name__}")
    stored = dict(error)
    for key, default in _TEXT_FIELDS:
        value = stored.setdefault(key, default)
        if not isinstance(value, str):
            raise ValueError(f"error[{key!r}] must be a str, got {type(value).__name__}")
    stored["message"] = cut_message(stored["message"])
    flag = stored.setdefault("retryable", retryable)
    if not isinstance(flag, bool):
        raise ValueError(f"error['retryable'] must be a bool, got {type(flag).__name__}")
    details = stored.get("details")
    if details is None:
        details = {}
    elif not isinstance(details, Mapping):
        raise ValueError(f"error['details'] must be a mapping, got {type(details).__name__}")
    stored["details"] = dict(details)
    text = dump_json(stored, what="error", check=False)
    if "\\u0000" in text or "\\ud" in text or "\\uD" in text:  # rare: only then a scan
        stored = load_json(_UNSTORABLE.sub(_escape_unstorable, text))
    return stored


class Settlement:
    """A worker's writes of task outcomes. `TaskContext` settles through it too."""

    # Queued-but-unwritten results beyond this many make handlers wait for the writer.
    MAX_BACKLOG_PER_SLOT = 4
    MAX_WRITE_ATTEMPTS = 20
    SETTLE_WAIT_S = 0.002
    PREFETCH_SETTLE_WAIT_S = PrefetchSizer.HORIZON_S
    #: Short of space with no result left to retry: how often one claim tries the disk.
    SPACE_PROBE_S = 5.0
    #: Short of space with results being retried: how often the claim loop looks again
    #: (the write that succeeds wakes it at once).
    SPACE_RECHECK_S = 1.0

    def __init__(
        self,
        store: TaskStore,
        inflight: InFlight,
        loop: LoopState,
        *,
        concurrency: int,
        retry_backoff_ms: int,
        retry_backoff_max_ms: int,
    ) -> None:
        self.store = store
        self.inflight = inflight
        self._loop = loop
        self._concurrency = concurrency
        self._retry_backoff = (retry_backoff_ms, retry_backoff_max_ms)
        self._pending: list[Pending] = []
        self._oldest = 0.0  # monotonic time the oldest pending result was queued
        self._flusher: asyncio.Task[None] | None = None
        self._retrying = False
        # Results taken into a claim transaction that has not ended yet.
        self._carried = 0
        self._nothing_carried = asyncio.Event()
        self._nothing_carried.set()
        #: When a result write was last refused for want of space; None once one succeeds.
        self._full_at: float | None = None

    @property
    def worker_id(self) -> str:
        return self.inflight.worker_id

    # -- single-task writes --------------------------------------------------------------

    async def complete_now(self, ctx: TaskContext, result: Any) -> Task | None:
        try:
            task = await self.store.complete(
                task_id=ctx.task_id, worker_id=self.worker_id, result=result, attempt=ctx.attempt
            )
        except LostLease:
            self.written()
            ctx._mark_lost()
            raise
        except Exception as exc:
            self.refused(exc)
            raise
        self.written()
        ctx._mark_settled()
        self.inflight.release_settled(ctx, task)
        return task

    async def fail_now(
        self, ctx: TaskContext, error: Mapping[str, Any], retryable: bool
    ) -> Task | None:
        """Write a failure (`ctx.fail`, and the worker's own through `settle_quietly`);
        an envelope `storable_error` refuses raises here, and nothing is written."""
        error = storable_error(error, retryable)
        base, cap = self._retry_backoff
        delay = backoff_delay_ms(ctx.attempt, base, cap) if retryable else 0
        try:
            task = await self.store.fail(
                task_id=ctx.task_id,
                worker_id=self.worker_id,
                error=error,
                retryable=retryable,
                delay_ms=delay,
                attempt=ctx.attempt,
            )
        except LostLease:
            self.written()
            ctx._mark_lost()
            raise
        except Exception as exc:
            self.refused(exc)
            raise
        self.written()
        ctx._mark_settled()
        self.inflight.release_settled(ctx, task, str(error.get("code", "")))
        return task

    async def settle_quietly(
        self, ctx: TaskContext, error: Mapping[str, Any], retryable: bool
    ) -> Task | None:
        """`fail_now` for the worker's own settlements: a lost lease or a failed write
        is reported and the task released, never raised into the call. Returns the
        task as written, None when it was not."""
        try:
            return await self.fail_now(ctx, error, retryable)
        except LostLease:
            self.inflight.release(ctx, "lease_lost", "the database refused the failure")
        except Exception as exc:
            self.inflight.report(exc, {"phase": "execute", "task_id": ctx.task_id})
            # Unwritten: stop renewing the lease so recovery hands the task on, rather
            # than the heartbeat keeping it ours forever.
            self.inflight.release(ctx, "lease_lost", f"the failure could not be written: {exc}")
        return None

    # -- returned results, batched -------------------------------------------------------

    def enqueue(self, ctx: TaskContext, encoded: str | None) -> None:
        """Queue a result; the handler's call slot is free as soon as this returns."""
        self.inflight.returned(ctx)
        first = not self._pending
        self._pending.append((ctx, encoded))
        if self._flusher is not None:
            return  # the running writer picks it up
        if not self._loop.claims_will_settle():
            self._flusher = asyncio.create_task(self._flush())
        elif first:
            self._oldest = time.monotonic()
            # Wake the claim loop when this result is due, even if nothing else does.
            asyncio.get_running_loop().call_later(self._wait_s(), self._loop.wake)

    def _wait_s(self) -> float:
        return self.PREFETCH_SETTLE_WAIT_S if self._loop.ahead else self.SETTLE_WAIT_S

    def due(self) -> bool:
        """Whether the claim loop should run a cycle now to write queued results."""
        if not self._pending or self._flusher is not None or self._retrying:
            return False
        return time.monotonic() - self._oldest >= self._wait_s()

    def backlogged(self) -> bool:
        """More results queued than the writer is keeping up with."""
        limit = self.MAX_BACKLOG_PER_SLOT * max(1, self._concurrency + self._loop.ahead)
        return len(self._pending) > limit

    async def backpressure(self) -> None:
        """Wait while `backlogged()` and a writer is working through it."""
        while self.backlogged() and self._flusher is not None:
            await asyncio.shield(self._flusher)

    async def drain(self) -> None:
        """Write everything queued, and wait for claims carrying results to end."""
        while True:
            # Again after each writer: one started by `write_due` writes a batch and
            # leaves what came meanwhile.
            self.put_back([])
            if self._flusher is not None:
                await asyncio.shield(self._flusher)
            elif self._carried:
                await self._nothing_carried.wait()
            else:
                return

    @contextlib.contextmanager
    def carried(self, batch: list[Pending]) -> Iterator[None]:
        """Around a claim transaction that carries `batch` (from `take`): `drain`
        waits for it too."""
        if not batch:
            yield
            return
        self._carried += 1
        self._nothing_carried.clear()
        try:
            yield
        finally:
            self._carried -= 1
            if not self._carried:
                self._nothing_carried.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def take(self) -> list[Pending]:
        """Hand the queued results to the claim loop, to write inside its claim.
        Not while a failed batch is being retried: the claim would fail with it."""
        if self._retrying:
            return []
        batch, self._pending = self._writable(self._pending), []
        return batch

    def put_back(self, batch: list[Pending]) -> None:
        """Return results to the queue (a claim failed) and make sure a writer runs;
        with an empty batch: write what is queued now, no claim is coming."""
        if batch:
            self._retrying = True
        self._pending[:0] = batch
        if self._pending and self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())

    def write_due(self) -> None:
        """Write what is queued now in the background, once: results queued meanwhile
        wait for their own turn (`due`), so a worker keeping up with a stream writes a
        batch per settle interval rather than one after another, each a few rows."""
        if self._pending and self._flusher is None:
            self._flusher = asyncio.create_task(self._flush(once=True))

    # -- space ----------------------------------------------------------------------------

    def refused(self, exc: BaseException) -> None:
        """A write of results failed: if for want of space, claims hold (`space_hold`)."""
        if classify(exc) == "full":
            self._full_at = time.monotonic()

    def written(self) -> None:
        """A write of results went through: the disk has room, claims may go on."""
        if self._full_at is not None:
            self._full_at = None
            self._loop.wake()

    def space_hold(self) -> float | None:
        """None: results can be written, claim as usual. Otherwise claims hold for the
        seconds returned, or, at 0, one claim of a single task may try the disk (the
        hold then starts again, unless a result write succeeds meanwhile)."""
        if self._full_at is None:
            return None
        if self._pending or self._carried or self._flusher is not None:
            return self.SPACE_RECHECK_S  # the retried results are the probe
        now = time.monotonic()
        left = self._full_at + self.SPACE_PROBE_S - now
        if left > 0:
            return left
        self._full_at = now
        return 0.0

    def finish(self, batch: list[Pending], statuses: Mapping[str, str]) -> None:
        """Apply a write's reply: {task id: new status}; a missing id lost its lease."""
        self.written()
        for ctx, _ in batch:
            status = statuses.get(ctx.task_id)
            if status is None:
                ctx._mark_lost()
                self.inflight.release(ctx, "lease_lost", "the database refused the result")
            else:
                ctx._mark_settled()
                self.inflight.release(ctx, "retried" if status == "queued" else status)

    def _writable(self, batch: list[Pending]) -> list[Pending]:
        """Drop results whose lease may be gone: writing one could settle a later
        attempt of the same task with this attempt's result."""
        now = self.inflight.clock()
        keep: list[Pending] = []
        for item in batch:
            ctx = item[0]
            if ctx.lost_lease or ctx.lease_deadline <= now:
                ctx._mark_lost()
                self.inflight.release(ctx, "lease_lost", "result not written: lease expired")
            else:
                keep.append(item)
        return keep

    async def _flush(self, *, once: bool = False) -> None:
        failures = 0
        try:
            while self._pending:
                batch, self._pending = self._writable(self._pending), []
                if not batch:
                    continue
                try:
                    statuses = await self._write(batch)
                except Exception as exc:
                    if not is_transient(exc):
                        # One row the database refuses fails the whole statement:
                        # write each result alone so only that task is affected.
                        await self._write_each(batch)
                        continue
                    # Not written: the leases stay ours and the heartbeat keeps them,
                    # so put the batch back and try again shortly. After a few seconds
                    # give up; the leases then expire and the tasks are redelivered.
                    # Short of space, claims hold, and the results are kept while
                    # their leases are ours (`_writable`), unless the worker is stopping.
                    self.inflight.report(exc, {"phase": "execute", "tasks": len(batch)})
                    self.refused(exc)
                    failures += 1
                    keep = classify(exc) == "full" and not self._loop.stop.is_set()
                    retry = failures < self.MAX_WRITE_ATTEMPTS or keep
                    if retry and not isinstance(exc, StoreClosed):
                        self._pending[:0] = batch
                        await asyncio.sleep(0.25)
                    else:
                        for ctx, _ in batch:
                            self.inflight.release(ctx, "lease_lost", f"result not written: {exc}")
                    continue
                failures = 0
                self.finish(batch, statuses)
                if once:
                    break
        finally:
            self._flusher = None
            self._retrying = False
            if once and self._pending:
                # Queued while this write ran, which `enqueue` left to it: due a settle
                # interval from now, and the loop woken then.
                self._oldest = time.monotonic()
                asyncio.get_running_loop().call_later(self._wait_s(), self._loop.wake)

    async def _write(self, batch: list[Pending]) -> dict[str, str]:
        return await self.store.complete_many(
            worker_id=self.worker_id,
            items=[(ctx.task_id, encoded, ctx.attempt) for ctx, encoded in batch],
        )

    async def _write_each(self, batch: list[Pending]) -> None:
        for ctx, encoded in batch:
            try:
                self.finish([(ctx, encoded)], await self._write([(ctx, encoded)]))
            except Exception as exc:
                self.inflight.report(exc, {"phase": "execute", "task_id": ctx.task_id})
                self.refused(exc)
                if is_transient(exc):
                    # Its lease expires and the task is redelivered.
                    self.inflight.release(ctx, "lease_lost", f"result not written: {exc}")
                    continue
                error = envelope(
                    type(exc).__name__,
                    "unserializable_result",
                    f"the database refused the result: {exc}",
                )
                await self.settle_quietly(ctx, error, False)
