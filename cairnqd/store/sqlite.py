"""`SQLiteStore`: the protocol on one SQLite file, from the stdlib `sqlite3`.

Design notes.

- Statements run on the event-loop thread. A prepared SQLite statement takes
  microseconds; a hop to a helper thread per statement (what aiosqlite does) costs more
  than the work. What must never happen on the loop is *waiting*: after connect the
  connection's busy_timeout is 0, and SQLITE_BUSY is retried with an awaited, jittered
  backoff (0.5 ms doubling to 4 ms, within `busy_timeout_ms`; `_Backoff` says why the
  cap is small), re-taking the in-process lock on each attempt so reads keep flowing
  meanwhile.
- Group commit. Single-statement writes are queued; one flusher runs everything queued
  in one `BEGIN IMMEDIATE … COMMIT` (a lone write runs in autocommit), and resolves
  each caller only after COMMIT. A statement error fails only its caller. The flusher
  loops while writes are pending rather than re-arming per batch.
- Transactions (keyed submits, claim sessions) hold the in-process lock for their
  whole life: one connection cannot interleave two transactions.
- Connect (open, WAL, migrations, statistics) runs in a thread: a cold start may wait
  on another process's migration, and that wait must not stall the loop.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from cairnqd._protocol import Statement, statement
from cairnqd.errors import (
    MigrationsPending,
    NotACairnqDatabase,
    ProtocolVersionMismatch,
    StoreClosed,
)
from cairnqd.store.base import Clock, Params, Row, Session, TaskStore
from cairnqd.store.errors import is_sqlite_busy
from cairnqd.store.migrate import apply_sqlite, pending_sqlite

_OPTIMIZE_EVERY_S = 60.0
_WAL_RETRY_S = 0.05
# How often an idle waiter looks at `pragma data_version` (a shared-memory read).
_WAKE_POLL_S = 0.002


def _is_memory(path: str) -> bool:
    return path == ":memory:" or "mode=memory" in path


class _Write:
    __slots__ = ("future", "params", "stmt")

    def __init__(self, stmt: Statement, params: Mapping[str, Any], future: asyncio.Future[Any]):
        self.stmt = stmt
        self.params = params
        self.future = future


class SQLiteStore(TaskStore):
    dialect = "sqlite"
    json_is_text = True
    purge_batch_pause_s = 0.05

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_ms: int = 5000,
        synchronous: str = "full",
        migrate: bool = True,
        clock: Clock | None = None,
    ) -> None:
        """`synchronous="full"` (the default) fsyncs the WAL on every commit, so a
        submitted or finished task survives a power cut. `"normal"` skips that fsync
        (commits are ~30x cheaper): a crash of the process loses nothing, but a power
        cut may roll back the last commits, re-running tasks that had finished and
        losing tasks submitted in the final moments.

        `clock` (epoch milliseconds) is what every statement reads as now; tests pass
        one to age rows without waiting."""
        super().__init__(clock=clock)
        if synchronous not in ("full", "normal"):
            raise ValueError(f"synchronous must be 'full' or 'normal', got {synchronous!r}")
        self.path = str(path)
        self.busy_timeout_ms = busy_timeout_ms
        self.synchronous = synchronous
        # False: refuse a database with pending migrations instead of applying them.
        self.migrate = migrate
        self._conn: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()
        self._pending: list[_Write] = []
        self._flusher: asyncio.Task[None] | None = None
        self._closing = False
        self._closed_memory = False
        self._last_optimize = 0.0
        # Bumped after each of our own commits; wakes this process's idle waiters.
        self._local_commits = 0
        self._wake_baseline: tuple[int, int] | None = None
        self._ever_connected = False

    # -- connect / close ---------------------------------------------------------------

    async def connect(self) -> None:
        if self._conn is not None:
            return
        if self._closed_memory:
            raise StoreClosed(
                "this in-memory store was closed and its data is gone; create a new store"
            )
        self._closing = False
        self._ever_connected = True
        self._conn = await asyncio.to_thread(self._open)
        version = await self.protocol_version()
        if version != 1:
            conn, self._conn = self._conn, None
            conn.close()
            raise ProtocolVersionMismatch(
                f"{self.path}: storage protocol_version={version}, cairnqd supports 1"
            )
        if self._retention is not None:
            self._retention.start()

    def _open(self) -> sqlite3.Connection:
        memory = _is_memory(self.path)
        if not memory:
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path,
            isolation_level=None,
            check_same_thread=False,
            uri=self.path.startswith("file:"),
            cached_statements=256,
        )
        try:
            conn.execute(f"pragma busy_timeout = {int(self.busy_timeout_ms)}")
            if not memory:
                self._enable_wal(conn)
            conn.execute("pragma foreign_keys = on")
            conn.execute(f"pragma synchronous = {self.synchronous}")
            if self.migrate:
                apply_sqlite(conn)
            elif pending := pending_sqlite(conn):
                raise MigrationsPending(self.path, pending)
            self._refresh_statistics(conn)
            conn.execute("pragma busy_timeout = 0")
        except sqlite3.DatabaseError as exc:
            conn.close()
            if not _looks_foreign(exc):
                raise
            raise NotACairnqDatabase(
                f"{self.path} is not a SQLite database cairnqd can use: {exc}"
            ) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        # Switching to WAL answers SQLITE_BUSY at once instead of honouring
        # busy_timeout while another process holds the file, so retry it.
        deadline = time.monotonic() + max(self.busy_timeout_ms, 1) / 1000
        while True:
            try:
                mode = conn.execute("pragma journal_mode = wal").fetchone()
                if mode and str(mode[0]).lower() == "wal":
                    return
                raise NotACairnqDatabase(f"{self.path}: cannot switch to WAL (got {mode})")
            except sqlite3.OperationalError as exc:
                if not is_sqlite_busy(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(_WAL_RETRY_S)

    def _refresh_statistics(self, conn: sqlite3.Connection) -> None:
        """Without statistics the planner guesses half the table is `running` and
        skips the partial lease index; before 3.46 `pragma optimize` never creates
        the first statistics, so bootstrap them with an explicit ANALYZE."""
        self._last_optimize = time.monotonic()
        try:
            has_stats = (
                conn.execute("select 1 from sqlite_master where name = 'sqlite_stat1'").fetchone()
                and conn.execute(
                    "select 1 from sqlite_stat1 where tbl = 'cairnq_tasks' limit 1"
                ).fetchone()
            )
            conn.execute("pragma optimize" if has_stats else "analyze cairnq_tasks")
        except sqlite3.OperationalError:
            pass  # best effort: busy or read-only; plans are still correct, just slower

    async def close(self) -> None:
        if self._conn is None:
            return
        self._closing = True
        if self._retention is not None:
            await self._retention.stop()
        while self._flusher is not None:
            await asyncio.shield(self._flusher)
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()
        if _is_memory(self.path):
            self._closed_memory = True

    def _connection(self) -> sqlite3.Connection:
        if self._closing or self._conn is None:
            raise StoreClosed(f"SQLite store {self.path} is closed")
        return self._conn

    # -- binding -----------------------------------------------------------------------

    # -- primitives --------------------------------------------------------------------

    async def _fetch(
        self, op: str, params: Params, supplied: frozenset[str] = frozenset()
    ) -> list[Row]:
        if self._conn is None and not self._ever_connected:
            await self.connect()  # first use connects, as the public SDK does
        stmt = statement("sqlite", op, supplied)
        if _is_read(stmt):
            return await self._read(stmt, params)
        self._connection()  # refuse new work while closing
        future: asyncio.Future[list[Row]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Write(stmt, params, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_pending())
        return await future

    async def _read(self, stmt: Statement, params: Params) -> list[Row]:
        budget = _Backoff(self.busy_timeout_ms)
        while True:
            async with self._lock:
                try:
                    return _run(self._connection(), stmt, params, self.now_ms)
                except sqlite3.OperationalError as exc:
                    if not is_sqlite_busy(exc) or budget.spent():
                        raise
            await budget.sleep()

    async def _flush_pending(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    await self._write_batch(batch)
                except BaseException as exc:
                    for write in batch:
                        if not write.future.done():
                            write.future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                # Let callers resumed by this batch queue their next writes.
                await asyncio.sleep(0)
        finally:
            self._flusher = None

    async def _write_batch(self, batch: list[_Write]) -> None:
        if len(batch) == 1:
            write = batch[0]
            budget = _Backoff(self.busy_timeout_ms)
            while True:
                async with self._lock:
                    try:
                        rows = _run(self._connection(), write.stmt, write.params, self.now_ms)
                    except sqlite3.OperationalError as exc:
                        if not is_sqlite_busy(exc) or budget.spent():
                            write.future.set_exception(exc)
                            return
                    except Exception as exc:
                        write.future.set_exception(exc)
                        return
                    else:
                        self._local_commits += 1
                        write.future.set_result(rows)
                        return
                await budget.sleep()
        conn = await self._begin_immediate()
        outcomes: list[tuple[_Write, list[Row] | None, BaseException | None]] = []
        try:
            for write in batch:
                try:
                    outcomes.append(
                        (write, _run(conn, write.stmt, write.params, self.now_ms), None)
                    )
                except Exception as exc:
                    outcomes.append((write, None, exc))
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        finally:
            self._maybe_optimize(conn)
            self._lock.release()
        self._local_commits += 1
        for write, got, error in outcomes:
            if error is not None:
                write.future.set_exception(error)
            else:
                write.future.set_result(got or [])

    async def _begin_immediate(self) -> sqlite3.Connection:
        """Take the in-process lock and SQLite's write lock; both held on return."""
        budget = _Backoff(self.busy_timeout_ms)
        while True:
            await self._lock.acquire()
            try:
                conn = self._connection()
                conn.execute("BEGIN IMMEDIATE")
                return conn
            except sqlite3.OperationalError as exc:
                self._lock.release()
                if not is_sqlite_busy(exc) or budget.spent():
                    raise
            except BaseException:
                self._lock.release()
                raise
            await budget.sleep()

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Session]:
        if self._conn is None and not self._ever_connected:
            await self.connect()
        conn = await self._begin_immediate()
        try:
            yield _SQLiteSession(conn, self.now_ms)
            conn.execute("COMMIT")
            self._local_commits += 1
        except BaseException:
            _rollback(conn)
            raise
        finally:
            self._lock.release()

    # -- wake-ups ----------------------------------------------------------------------

    async def claim_wake(self, queues: Sequence[str], timeout_ms: int) -> None:
        """Return early once any *other* connection commits to the file.

        `pragma data_version` changes when another connection (any process, any SDK)
        commits; reading it touches only the WAL index in shared memory, so an idle
        worker can look every couple of milliseconds without a write or a file read.
        Our own commits do not change it, so local writes wake waiters directly.
        """
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        # The baseline taken before the claim's probe, if there was one: a commit that
        # lands between the probe and this wait must still wake us.
        baseline, self._wake_baseline = self._wake_baseline, None
        start_version, local = baseline or (self._data_version(), self._local_commits)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            await asyncio.sleep(min(_WAKE_POLL_S, remaining))
            if self._local_commits != local or self._conn is None:
                return
            if self._data_version() != start_version:
                return

    async def task_done_wake(self, task_id: str, timeout_ms: int) -> None:
        self._wake_baseline = None
        await self.claim_wake((), timeout_ms)

    def _register_wakeable(self, queues: Sequence[str]) -> None:
        self._wake_baseline = (self._data_version(), self._local_commits)

    def _data_version(self) -> int:
        conn = self._conn
        if conn is None or self._lock.locked():
            return -1
        try:
            row = conn.execute("pragma data_version").fetchone()
        except sqlite3.Error:
            return -1
        return int(row[0]) if row else -1

    def _maybe_optimize(self, conn: sqlite3.Connection) -> None:
        # A connection opened on an empty database would plan as empty for days.
        if time.monotonic() - self._last_optimize > _OPTIMIZE_EVERY_S:
            self._refresh_statistics(conn)

    # -- daemon maintenance ------------------------------------------------------------

    async def after_purge(self) -> None:
        """A passive WAL checkpoint: keeps the WAL small after a purge without waiting
        on (or stalling) any reader or writer."""
        await self._fetch("wal_checkpoint", {})


def _bind(stmt: Statement, params: Mapping[str, Any], clock: Clock) -> dict[str, Any]:
    """Derive the absolute times this statement names, once, at bind time."""
    now = clock()
    bound: dict[str, Any] = {}
    for name in stmt.params:
        if name == "now_ms":
            bound[name] = now
        elif name == "lease_until_ms":
            bound[name] = now + int(params["lease_ms"])
        elif name == "run_at_ms":
            bound[name] = now + int(params.get("delay_ms", 0))
        elif name == "before_ms":
            bound[name] = now - int(params.get("older_than_ms", 0))
        else:
            value = params.get(name)
            if isinstance(value, list | tuple):
                value = json.dumps(list(value))
            elif isinstance(value, bool):
                value = int(value)
            bound[name] = value
    return bound


def _run(
    conn: sqlite3.Connection, stmt: Statement, params: Mapping[str, Any], clock: Clock
) -> list[Row]:
    cursor = conn.execute(stmt.text, _bind(stmt, params, clock))
    rows = cursor.fetchall()
    if not rows:
        return []
    columns = [d[0] for d in cursor.description]
    return [dict(zip(columns, row, strict=True)) for row in rows]


class _SQLiteSession:
    def __init__(self, conn: sqlite3.Connection, clock: Clock) -> None:
        self._conn = conn
        self._clock = clock

    async def fetch(
        self, op: str, params: Params, supplied: frozenset[str] = frozenset()
    ) -> list[Row]:
        return _run(self._conn, statement("sqlite", op, supplied), params, self._clock)


class _Backoff:
    """Jittered exponential waits for SQLITE_BUSY within a total budget.

    The cap is small on purpose. SQLite has no queue for its write lock: whoever asks
    the moment it is free wins. A process that just committed asks again within
    microseconds, so a rival backing off for tens of milliseconds almost never gets a
    turn (measured: 4 draining processes split 2,000 tasks 34/408/1558/0). Retrying
    every few milliseconds costs a failed BEGIN, a few microseconds, and gives every
    process its share.
    """

    _FIRST_S = 0.0005
    _CAP_S = 0.004

    def __init__(self, budget_ms: int) -> None:
        self._deadline = time.monotonic() + budget_ms / 1000
        self._delay = self._FIRST_S

    def spent(self) -> bool:
        return time.monotonic() >= self._deadline

    async def sleep(self) -> None:
        await asyncio.sleep(random.uniform(self._delay / 2, self._delay))
        self._delay = min(self._delay * 2, self._CAP_S)


def _rollback(conn: sqlite3.Connection) -> None:
    # Never let a failed rollback replace the error that caused it.
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except Exception:
        pass


def _is_read(stmt: Statement) -> bool:
    head = stmt.text.lstrip()[:6].lower()
    return head == "select" or (head.startswith("with") and "returning" not in stmt.text.lower())


def _looks_foreign(exc: sqlite3.DatabaseError) -> bool:
    text = str(exc).lower()
    return "not a database" in text or "file is encrypted" in text
