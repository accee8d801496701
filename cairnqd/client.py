"""`CairnQ`: the API-side handle. Submit, inspect, control and wait on tasks.

Names, arguments and defaults follow the public cairnq 0.15.1 client, so code written
for it runs unchanged after `import cairnqd as cairnq`. `submit_many` is ours.
"""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cairnqd.errors import TaskCanceled, TaskFailed, TaskTimeout
from cairnqd.models import Task, TaskDef, TaskRef, task_name
from cairnqd.retention import Retention, RetentionSweeper
from cairnqd.store.arguments import require_duration, require_str
from cairnqd.store.base import TaskStore
from cairnqd.store.callers import complete_now, is_async_shape
from cairnqd.tracing import traced_submit, traced_submit_many

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool


class CairnQ:
    def __init__(
        self,
        store: TaskStore,
        *,
        max_queue_depth: int | Mapping[str, int] | None = None,
        max_queue_wait_ms: int = 600_000,
        retention: int | Retention | None = None,
    ) -> None:
        # Checked even without a depth limit, which is when the SDK ignores it: a bad
        # value is a mistake either way, and found now rather than when a limit is set.
        require_duration(max_queue_wait_ms, "max_queue_wait_ms")
        self._store = store
        if max_queue_depth is not None:
            store.use_backpressure(max_queue_depth, max_queue_wait_ms=max_queue_wait_ms)
        self._sweeper: RetentionSweeper | None = None
        if retention is not None:
            policy = retention if isinstance(retention, Retention) else Retention(retention)
            self._sweeper = RetentionSweeper(store, policy)
            store.use_retention(self._sweeper)

    @classmethod
    def sqlite(cls, path: str, *, busy_timeout_ms: int = 5000, **client_kwargs: Any) -> CairnQ:
        from cairnqd.store.sqlite import SQLiteStore

        return cls(SQLiteStore(path, busy_timeout_ms=busy_timeout_ms), **client_kwargs)

    @classmethod
    def postgres(
        cls,
        source: str | AsyncConnectionPool[Any],
        *,
        min_size: int = 1,
        max_size: int = 10,
        schema: str | None = None,
        pooler: str = "none",
        direct_dsn: str | None = None,
        **client_kwargs: Any,
    ) -> CairnQ:
        """`source`: a libpq DSN (the store opens and closes a pool of its own), or a
        psycopg_pool `AsyncConnectionPool` your application owns: the store borrows
        its connections, hands each back as it came, and never opens or closes it
        (docs/transactions.md, "Sharing your connection pool")."""
        from cairnqd.store.postgres import PostgresStore

        store = PostgresStore(
            source,
            min_size=min_size,
            max_size=max_size,
            schema=schema,
            pooler=pooler,
            direct_dsn=direct_dsn,
        )
        return cls(store, **client_kwargs)

    @property
    def store(self) -> TaskStore:
        return self._store

    async def connect(self) -> None:
        await self._store.connect()

    async def close(self) -> None:
        # The store stops the sweeper (waiting for a sweep in flight) before closing.
        await self._store.close()

    async def __aenter__(self) -> CairnQ:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- submit ------------------------------------------------------------------------

    async def submit(
        self,
        name: str | TaskDef[Any, Any],
        payload: Any = None,
        *,
        key: str | None = None,
        queue: str = "default",
        conflict: str = "reuse",
        max_attempts: int = 3,
        priority: int = 0,
        metadata: Any = None,
        delay_ms: int = 0,
        tx: Any = None,
        after: Sequence[Task | TaskRef | str] | None = None,
    ) -> Task:
        """Queue a task. `tx`: your own open transaction on the same database (a
        psycopg connection, or a sqlite3.Connection on the store's file): the task then
        exists exactly when your transaction commits (docs/transactions.md).

        `after` (cairnqd only): tasks or task ids that must all succeed before this one
        can be claimed; one that fails or is canceled cancels it (docs/workflows.md)."""
        return await traced_submit(
            self._store.submit,
            name=task_name(name),
            payload=payload,
            key=key,
            queue=queue,
            conflict=conflict,
            max_attempts=max_attempts,
            priority=priority,
            metadata=metadata,
            delay_ms=delay_ms,
            tx=tx,
            after=after,
        )

    def submit_sync(
        self,
        name: str | TaskDef[Any, Any],
        payload: Any = None,
        *,
        tx: Any,
        key: str | None = None,
        queue: str = "default",
        conflict: str = "reuse",
        max_attempts: int = 3,
        priority: int = 0,
        metadata: Any = None,
        delay_ms: int = 0,
    ) -> Task:
        """`submit` for sync code (Django views, scripts, a SQLAlchemy `Session`),
        through your open transaction `tx`: a psycopg `Connection`, a sqlite3
        `Connection`, a SQLAlchemy `Session` or `Connection`, or Django's connection.
        Runs in the calling thread, with no event loop; the client need not be
        connected (docs/transactions.md)."""
        _check_sync(tx, "submit_sync")
        return complete_now(
            self.submit(
                name, payload, key=key, queue=queue, conflict=conflict,
                max_attempts=max_attempts, priority=priority, metadata=metadata,
                delay_ms=delay_ms, tx=tx,
            )
        )  # fmt: skip

    def submit_many_sync(self, tasks: Sequence[Mapping[str, Any]], *, tx: Any) -> list[Task]:
        """`submit_many` for sync code, through your open transaction `tx`, as
        `submit_sync`."""
        _check_sync(tx, "submit_many_sync")
        if not tasks:
            return []
        return complete_now(self.submit_many(tasks, tx=tx))

    async def submit_many(
        self, tasks: Sequence[Mapping[str, Any]], *, tx: Any = None
    ) -> list[Task]:
        """Submit a list of tasks in one transaction (all or nothing), in order.

        Each item is a mapping of `submit` arguments: `name` (a string or TaskDef)
        plus any of payload, key, queue, conflict, max_attempts, priority, metadata,
        delay_ms, and `after`: earlier items of the list by index, or existing tasks
        or ids, that must succeed first (docs/workflows.md). A bad item raises
        ValueError naming its index; nothing is written.
        `tx`: your own open transaction, as for `submit`.
        """
        return await traced_submit_many(self._store.submit_many, tasks, tx=tx)

    # -- reads and control ---------------------------------------------------------------

    async def get(self, task_id: str) -> Task | None:
        return await self._store.get(task_id)

    async def get_by_key(self, key: str) -> Task | None:
        return await self._store.get_by_key(key)

    async def get_status(self, task_id: str) -> TaskRef | None:
        return await self._store.get_status(task_id)

    async def get_status_by_key(self, key: str) -> TaskRef | None:
        return await self._store.get_status_by_key(key)

    async def list(
        self,
        *,
        status: str | None = None,
        queue: str | None = None,
        name: str | None = None,
        root_id: str | None = None,
        correlation_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Task]:
        return await self._store.list(
            status=status,
            queue=queue,
            name=name,
            root_id=root_id,
            correlation_id=correlation_id,
            limit=limit,
            offset=offset,
        )

    async def cancel(self, task_id: str) -> Task | None:
        return await self._store.cancel(task_id)

    async def cancel_by_key(self, key: str) -> Task | None:
        return await self._store.cancel_by_key(key)

    async def retry(self, task_id: str, *, reset_attempt: bool = False) -> Task | None:
        return await self._store.retry(task_id, reset_attempt=reset_attempt)

    async def retry_by_key(self, key: str, *, reset_attempt: bool = False) -> Task | None:
        return await self._store.retry_by_key(key, reset_attempt=reset_attempt)

    async def purge(
        self,
        *,
        older_than_ms: int = 0,
        queue: str | None = None,
        status: str | None = None,
        name: str | None = None,
        limit: int = 1000,
    ) -> builtins.list[str]:
        return await self._store.purge(
            older_than_ms=older_than_ms, queue=queue, status=status, name=name, limit=limit
        )

    async def stats(self, queue: str | None = None) -> dict[str, dict[str, int]]:
        return await self._store.stats(queue)

    async def queue_depth(self, queue: str, max_depth: int) -> int:
        return await self._store.queue_depth(queue, max_depth)

    # -- waiting -----------------------------------------------------------------------

    async def wait(
        self, task_id: str, *, timeout_ms: int = 30_000, poll_ms: int = 100, max_poll_ms: int = 500
    ) -> Task:
        require_str(task_id, "task_id")
        return await wait_for_task(
            self._store, task_id, None, timeout_ms=timeout_ms, poll_ms=poll_ms,
            max_poll_ms=max_poll_ms,
        )  # fmt: skip

    async def wait_by_key(
        self, key: str, *, timeout_ms: int = 30_000, poll_ms: int = 100, max_poll_ms: int = 500
    ) -> Task:
        require_str(key, "key")
        return await wait_for_task(
            self._store, None, key, timeout_ms=timeout_ms, poll_ms=poll_ms,
            max_poll_ms=max_poll_ms,
        )  # fmt: skip

    async def call(
        self,
        name: str | TaskDef[Any, Any],
        payload: Any = None,
        *,
        timeout_ms: int = 30_000,
        poll_ms: int = 100,
        max_poll_ms: int = 500,
        **submit_kwargs: Any,
    ) -> Any:
        """Submit and wait; the result on success, TaskFailed / TaskCanceled /
        TaskTimeout otherwise (the task keeps running after a timeout)."""
        # Before the submit: a wait that cannot start must not leave a task behind.
        check_wait(timeout_ms, poll_ms, max_poll_ms)
        task = await self.submit(name, payload, **submit_kwargs)
        done = await self.wait(
            task.id, timeout_ms=timeout_ms, poll_ms=poll_ms, max_poll_ms=max_poll_ms
        )
        return outcome(done)


def outcome(task: Task) -> Any:
    if task.status == "succeeded":
        return task.result
    if task.status == "canceled":
        raise TaskCanceled(task.id)
    raise TaskFailed(task.error)


def next_poll_ms(current: int, max_poll_ms: int) -> int:
    # `max(cur + 1, …)` so a 1 ms interval still grows (int(1 * 1.5) == 1).
    return min(max_poll_ms, max(current + 1, int(current * 1.5)))


async def wait_for_task(
    store: TaskStore,
    task_id: str | None,
    key: str | None,
    *,
    timeout_ms: int,
    poll_ms: int,
    max_poll_ms: int,
) -> Task:
    """Poll a task (by id, or by key re-resolved every beat) until it is terminal.

    The probe reads only `{id, status}`; the full row (a payload may be large) is read
    only once the probe says terminal, or at the timeout for the error's snapshot.
    """
    if task_id is not None or key is None:
        require_str(task_id, "task_id")
    else:
        require_str(key, "key")
    check_wait(timeout_ms, poll_ms, max_poll_ms)
    deadline = time.monotonic() + timeout_ms / 1000
    interval = poll_ms
    while True:
        ref = await (store.get_status(task_id) if task_id else store.get_status_by_key(key or ""))
        if ref is not None and ref.is_terminal:
            task = await store.get(ref.id)
            # Between the two reads the task may have been retried or purged.
            if task is not None and task.is_terminal:
                return task
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            # The snapshot the error describes; a task that finished since the probe
            # is simply the answer. A key that points at nothing now has no task.
            snapshot = await store.get(ref.id) if ref is not None else None
            if snapshot is not None and snapshot.is_terminal:
                return snapshot
            raise TaskTimeout(
                ref.id if ref is not None else (task_id or key or ""),
                timeout_ms=timeout_ms,
                task=snapshot,
                key=key,
            )
        sleep_ms = min(interval, remaining_ms)
        if ref is not None:
            await store.task_done_wake(ref.id, sleep_ms)
        else:
            await asyncio.sleep(sleep_ms / 1000)
        interval = next_poll_ms(interval, max_poll_ms)


def check_wait(timeout_ms: Any, poll_ms: Any, max_poll_ms: Any) -> None:
    """A wait's durations: integers of milliseconds the deadline arithmetic can take
    (a NaN, an infinity or a string used to fail inside it, naming none of them)."""
    require_duration(timeout_ms, "timeout_ms")
    require_duration(poll_ms, "poll_ms", minimum=1)
    require_duration(max_poll_ms, "max_poll_ms", minimum=1)


def _check_sync(tx: Any, method: str) -> None:
    """A sync submit needs a sync transaction to write through."""
    if tx is None:
        raise TypeError(
            f"{method} needs tx=: your open transaction (without one, use `await submit`)"
        )
    kind = type(tx).__module__
    if is_async_shape(tx) or (kind.startswith("psycopg") and "Async" in type(tx).__name__):
        raise TypeError(
            f"{method}: tx= is an asyncio connection ({kind}.{type(tx).__name__}); "
            "use `await submit(..., tx=...)` from async code"
        )
