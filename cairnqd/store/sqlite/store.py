"""`SQLiteStore`: the protocol on one SQLite file, from the stdlib `sqlite3`. Statements
run on the event loop and never wait there; single writes are group-committed; close
drains; text that is not UTF-8 is read back escaped (docs/architecture.md, "The SQLite
store").
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from cairnqd._ids import new_task_ids
from cairnqd._jsoncodec import UndecodableText, tolerant_text
from cairnqd._protocol import Statement, on_demand, statement
from cairnqd.errors import StoreClosed
from cairnqd.models import Task
from cairnqd.store.base import (
    Clock,
    Params,
    Row,
    Session,
    TaskStore,
)
from cairnqd.store.bulk import insert_in_runs
from cairnqd.store.clockstep import WallClockWatch
from cairnqd.store.coalesce import SubmitCoalescer
from cairnqd.store.dependencies import item_refs
from cairnqd.store.executor import unsupported_tx
from cairnqd.store.sqlite.bulk import PIPELINE_FROM, insert_steps
from cairnqd.store.sqlite.callertx import caller_session, plain_session
from cairnqd.store.sqlite.errors import is_sqlite_busy
from cairnqd.store.sqlite.files import is_memory, open_database, refresh_statistics
from cairnqd.store.sqlite.filewatch import FileWatch
from cairnqd.store.sqlite.statements import (
    Backoff,
    SQLiteSession,
    bind,
    is_read,
    rollback,
    run,
    stop_step,
)
from cairnqd.store.statement_params import insert_rows, new_task

T = TypeVar("T")
A = TypeVar("A")

_OPTIMIZE_EVERY_S = 60.0
# How often an idle waiter looks at `pragma data_version` (a shared-memory read) where
# the kernel does not report writes to the database's files (store/sqlite/filewatch.py).
_WAKE_POLL_S = 0.002
# After the kernel reports a write, how long a waiter polls for the commit to show.
_PUBLISH_WAIT_S = 0.1
_PUBLISH_POLL_S = 0.0005
# Rows a scan hands to the loop at once: ~2 ms of decoding for a typical task row.
_SCAN_CHUNK = 128


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
    # With the write lock held, a transaction's statements run on the event loop's
    # thread, one after another, and commit: nothing inside it awaits.
    brief_transactions = True
    one_writer = True

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
        super().__init__(clock=clock, describe=f"SQLite store {path}")
        if clock is None:
            # Leases and due times here are the host's wall clock: ride out its steps
            # (an injected clock is a test's, moved on purpose).
            self.use_clock_watch(WallClockWatch())
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
        self._closed_memory = False
        self._scan_thread: ThreadPoolExecutor | None = None
        self._last_optimize = 0.0
        # Bumped after each of our own commits; wakes this process's idle waiters.
        self._local_commits = 0
        self._wake_baseline: tuple[int, int] | None = None
        # Made on the first wait, again in a forked child (`_file_watch`); None where
        # the kernel cannot watch the files: waiters poll.
        self._watch: FileWatch | None = None
        #: The watch's count of writes when a wait last saw a commit show: any write
        #: counted since may belong to a commit not yet published (`claim_wake`).
        self._writes_shown = 0
        self._watch_tried = False
        # Concurrent keyless submits share one insert_many (store/coalesce.py). Its
        # writer writes on behalf of callers that were admitted and are waiting, so its
        # statements pass while the store closes (a submit queued before close lands).
        self.submits = SubmitCoalescer(
            self.barrier.on_behalf(self._insert_one),
            self.barrier.on_behalf(self._insert_many_keyless),
        )

    # -- connect / close ---------------------------------------------------------------

    def use_clock_watch(self, watch: WallClockWatch) -> None:
        """Read every statement's now from `watch`, which rides out wall-clock steps."""
        self.clock_watch = watch
        self.now_ms = watch

    async def connect(self) -> None:
        self.barrier.check_open()
        await self._open()

    async def _open(self) -> sqlite3.Connection:
        """The connection, opened first when needed; concurrent callers share one open
        (first use connects, as the public SDK does, and so does use after close)."""
        while self._conn is None:
            if self._closed_memory:
                raise StoreClosed(
                    f"in-memory database {self.path!r} was closed — its contents went with "
                    "the connection, so reopening would silently start from empty. Use a "
                    "file path if the store needs to outlive a close."
                )
            await self._opener.run(self._open_now)
        return self._conn

    async def _open_now(self) -> None:
        self._conn = await asyncio.to_thread(
            open_database,
            self.path,
            busy_timeout_ms=self.busy_timeout_ms,
            synchronous=self.synchronous,
            migrate=self.migrate,
        )
        self._last_optimize = time.monotonic()
        self._opened()

    async def _shut(self) -> None:
        try:
            if self._conn is None:
                return
            await self._closing()
            await self.barrier.drain()
            while self._flusher is not None:
                await asyncio.shield(self._flusher)
            async with self._lock:
                conn, self._conn = self._conn, None
                if conn is not None:
                    conn.close()
            if self._watch is not None:
                self._watch.close()
            self._watch, self._watch_tried = None, False
            if is_memory(self.path):
                self._closed_memory = True
        finally:
            if self._scan_thread is not None:
                self._scan_thread.shutdown(wait=False)
                self._scan_thread = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreClosed(f"SQLite store {self.path} is closed")
        return self._conn

    # -- primitives --------------------------------------------------------------------

    async def _caller_session(self, tx: object) -> Session:
        return plain_session(self._caller_connection(tx), self.path, self.now_ms)

    def _in_caller_tx(self, tx: object) -> AbstractAsyncContextManager[Session]:
        return caller_session(self._caller_connection(tx), self.path, self.now_ms)

    def _caller_connection(self, tx: object) -> sqlite3.Connection:
        if not isinstance(tx, sqlite3.Connection):
            raise unsupported_tx(tx, f"a sqlite3.Connection on {self.path}")
        return tx

    async def _insert_keyless(self, params: Params) -> Task:
        return await self.submits.submit(params)

    async def _insert_run(
        self, fetch: Callable[[str, Params], Awaitable[list[Row]]], run: Sequence[Params]
    ) -> list[Task]:
        """One `insert_many` of validated keyless submits, through `fetch` (the store's,
        or a transaction's). Here insert_many is a row statement binding each task's
        values as they are, and the times are the store's own, so nothing is read back."""
        now = self.now_ms()
        await fetch("insert_many", {"values": insert_rows(run, now)})
        return [new_task(p, now + p["delay_ms"], now) for p in run]

    async def submit_many(
        self, tasks: Sequence[Mapping[str, Any]], *, tx: object = None
    ) -> list[Task]:
        """A long list is checked a step at a time inside its write transaction while
        the helper thread inserts the step before (store/sqlite/bulk.py): still all or
        nothing, a bad item late in the list rolls back the rows before it. Through
        the caller's transaction (`tx`) it is the plain path."""
        items = tasks if isinstance(tasks, list | tuple) else list(tasks)
        if (
            tx is not None
            or self._gate is not None
            or len(items) < PIPELINE_FROM
            or item_refs(items) is not None
        ):
            return await super().submit_many(items, tx=tx)
        ids = new_task_ids(len(items))
        async with self._write_locked() as conn:
            session = SQLiteSession(conn, self.now_ms)
            now_ms = self.now_ms()

            async def insert_run(start: int, stop: int) -> list[Task]:
                return await insert_steps(conn, self._off_loop, items, ids, (start, stop), now_ms)

            async def submit_keyed(params: Params) -> Task:
                return await self._submit_keyed(session, params)

            return await insert_in_runs(items, ids, insert_run, submit_keyed)

    async def _fetch(
        self, op: str, params: Params, supplied: frozenset[str] = frozenset()
    ) -> list[Row]:
        with self._operation():
            stmt = statement("sqlite", op, supplied)
            if self._conn is None:
                await self._open()
            if is_read(stmt):
                try:
                    return await self._read(stmt, params)
                except sqlite3.OperationalError as exc:
                    if not is_undecodable_text(exc):
                        raise
                return await self._read(stmt, params, tolerant=True)
            future: asyncio.Future[list[Row]] = asyncio.get_running_loop().create_future()
            self._pending.append(_Write(stmt, params, future))
            if self._flusher is None:
                self._flusher = asyncio.create_task(self._flush_pending())
            return await future

    async def _read(self, stmt: Statement, params: Params, *, tolerant: bool = False) -> list[Row]:
        # Yield even when the lock is free: see "a fair share of the loop".
        await asyncio.sleep(0)
        budget = Backoff(self.busy_timeout_ms)
        while True:
            async with self._lock:
                try:
                    if tolerant:
                        with _tolerant(self._connection()) as conn:
                            return run(conn, stmt, params, self.now_ms)
                    return run(self._connection(), stmt, params, self.now_ms)
                except sqlite3.OperationalError as exc:
                    if not is_sqlite_busy(exc) or budget.spent():
                        raise
            await budget.sleep()

    async def _scan(
        self,
        op: str,
        params: Params,
        supplied: frozenset[str],
        convert: Callable[[list[Row]], list[T]],
    ) -> list[T]:
        with self._operation():
            stmt = statement("sqlite", op, supplied)
            await self._open()
            budget = Backoff(self.busy_timeout_ms)
            tolerant = False
            while True:
                async with self._lock:
                    try:
                        if tolerant:
                            with _tolerant(self._connection()):
                                return await self._scan_locked(stmt, params, convert)
                        return await self._scan_locked(stmt, params, convert)
                    except sqlite3.OperationalError as exc:
                        if is_undecodable_text(exc) and not tolerant:
                            tolerant = True  # read it all again, at once
                            continue
                        if not is_sqlite_busy(exc) or budget.spent():
                            raise
                await budget.sleep()

    async def _scan_locked(
        self, stmt: Statement, params: Params, convert: Callable[[list[Row]], list[T]]
    ) -> list[T]:
        conn = self._connection()
        cursor = await self._stepped(conn, conn.execute, stmt.text, bind(stmt, params, self.now_ms))
        try:
            columns = [d[0] for d in cursor.description]
            out: list[T] = []
            while True:
                rows = await self._stepped(conn, cursor.fetchmany, _SCAN_CHUNK)
                out.extend(convert([dict(zip(columns, row, strict=True)) for row in rows]))
                if len(rows) < _SCAN_CHUNK:
                    return out
        finally:
            # An abandoned scan must not keep its read transaction open.
            cursor.close()

    async def _stepped(self, conn: sqlite3.Connection, step: Callable[..., T], *args: Any) -> T:
        """`step(*args)` on the helper thread, the in-process lock held by the caller."""
        done = self._off_loop(step, *args)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            await stop_step(conn, done)
            raise

    def _off_loop(self, step: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Start `step(*args)` on the store's helper thread. The caller holds the
        in-process lock until the step has ended (`stop_step` ends it early)."""
        if self._scan_thread is None:
            self._scan_thread = ThreadPoolExecutor(1, thread_name_prefix="cairnqd-sqlite-scan")
        return asyncio.get_running_loop().run_in_executor(self._scan_thread, step, *args)

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
            await self._write_one(batch[0])
            return
        conn = await self._begin_immediate()
        outcomes: list[tuple[_Write, list[Row] | None, BaseException | None]] = []
        try:
            for write in batch:
                try:
                    rows = run(conn, write.stmt, write.params, self.now_ms)
                    outcomes.append((write, rows, None))
                except Exception as exc:
                    reread = self._reread_written(conn, write, exc)
                    outcomes.append((write, reread, None if reread is not None else exc))
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
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

    async def _write_one(self, write: _Write) -> None:
        """A lone write, in autocommit."""
        budget = Backoff(self.busy_timeout_ms)
        while True:
            async with self._lock:
                try:
                    rows = run(self._connection(), write.stmt, write.params, self.now_ms)
                except sqlite3.OperationalError as exc:
                    reread = self._reread_written(self._connection(), write, exc)
                    if reread is not None:
                        write.future.set_result(reread)
                        return
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

    def _reread_written(
        self, conn: sqlite3.Connection, write: _Write, exc: BaseException
    ) -> list[Row] | None:
        """A one-task write (cancel, retry, an owned write) whose returned row holds
        text that is not UTF-8: the write is done (SQLite applies an UPDATE before
        its first row comes back), only its row could not be fetched. Read that row
        again, such text escaped, as the write's answer; None for any other failure."""
        if not is_undecodable_text(exc) or write.stmt.name not in _ONE_ROW_WRITES:
            return None
        with _tolerant(conn) as tolerant:
            return run(
                tolerant, statement("sqlite", "get"), {"id": write.params["id"]}, self.now_ms
            )

    async def _begin_immediate(self) -> sqlite3.Connection:
        """Take the in-process lock and SQLite's write lock; both held on return."""
        budget = Backoff(self.busy_timeout_ms)
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
        async with self._write_locked() as conn:
            yield SQLiteSession(conn, self.now_ms)

    @asynccontextmanager
    async def _replay_transaction(self) -> AsyncIterator[Session]:
        async with self._write_locked(tolerant=True) as conn:
            yield SQLiteSession(conn, self.now_ms)

    def _is_undecodable_text(self, exc: BaseException) -> bool:
        return is_undecodable_text(exc)

    def _row_key(self, task_id: Any) -> Any:
        return task_id.raw if isinstance(task_id, UndecodableText) else task_id

    @asynccontextmanager
    async def _write_locked(self, *, tolerant: bool = False) -> AsyncIterator[sqlite3.Connection]:
        """`BEGIN IMMEDIATE` … `COMMIT` (rolled back on error), the in-process lock
        held throughout: the connection, for the statements in between. `tolerant`:
        text that is not UTF-8 reads as `UndecodableText` meanwhile."""
        with self._operation():
            if self._conn is None:
                await self._open()
            await asyncio.sleep(0)  # see "a fair share of the loop"
            conn = await self._begin_immediate()
            if tolerant:
                conn.text_factory = tolerant_text
            try:
                yield conn
                conn.execute("COMMIT")
                self._local_commits += 1
            except BaseException:
                rollback(conn)
                raise
            finally:
                if tolerant:
                    conn.text_factory = str
                self._lock.release()

    # -- wake-ups ----------------------------------------------------------------------

    async def claim_wake(self, queues: Sequence[str], timeout_ms: int) -> None:
        """Return early once any *other* connection commits to the file.

        `pragma data_version` changes when another connection (any process, any SDK)
        commits; reading it touches only the WAL index in shared memory. It is read
        each time the kernel reports a write to the database's files, or every couple
        of milliseconds where it cannot (store/sqlite/filewatch.py). Our own commits
        do not change it, so local writes wake waiters directly.
        """
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        # The baseline taken before the claim's probe, if there was one: a commit that
        # lands between the probe and this wait must still wake us.
        baseline, self._wake_baseline = self._wake_baseline, None
        start_version, local = baseline or (self._data_version(), self._local_commits)
        watch = self._file_watch()
        polling_until = 0.0
        while True:
            # Read before the look below: a write after it is still counted, so the
            # wait that follows ends at once (filewatch.FileWatch.next_write).
            writes = watch.writes if watch is not None else 0
            if self._local_commits != local or self._conn is None:
                return
            version = self._data_version()  # -1: unknown while our transaction runs
            if version != start_version and version != -1:
                self._writes_shown = writes
                return
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                return
            if now < polling_until:
                await asyncio.sleep(min(_PUBLISH_POLL_S, remaining))
                continue
            if watch is None or not watch.usable or version == -1:
                await asyncio.sleep(min(_WAKE_POLL_S, remaining))
                continue
            if writes != self._writes_shown and now < watch.last_write_at + _PUBLISH_WAIT_S:
                # A write already counted in `writes` (seen before this wait began, while
                # the loop did other work) may be a commit not yet published: waiting
                # for the next write would miss it until some later commit or the poll
                # interval. With one child of a group answering wake-ups, nothing else
                # hid that (docs/architecture.md, "cairnqd/daemon/wakerole.py"). Looked for
                # at the idle pace, not the publish's: nearly always that commit showed
                # before this wait began, and the looks cost an idle waiter its CPU.
                await asyncio.sleep(min(_WAKE_POLL_S, remaining))
                continue
            await watch.next_write(writes, remaining)
            if watch.writes != writes:
                # A commit writes its frames before it publishes them (the fsync, then
                # the WAL index in shared memory, which no write(2) reports): until
                # `data_version` shows it, look often (a few looks: it is under way).
                polling_until = time.monotonic() + _PUBLISH_WAIT_S

    def _file_watch(self) -> FileWatch | None:
        """The watch on the database's files; a new one in a forked child, whose copy
        of its parent's is not its own to read."""
        watch = self._watch
        if watch is not None and not watch.mine:
            watch.close()
            watch, self._watch_tried = None, False
        if not self._watch_tried and self._conn is not None:
            self._watch_tried = True
            # The file as SQLite opened it (a URI or a relative path resolved); ""
            # for a database in memory, which no other process can write.
            rows = self._conn.execute("pragma database_list").fetchall()
            file = next((str(r[2]) for r in rows if r[1] == "main"), "")
            watch = FileWatch.open(file) if file else None
        self._watch = watch
        return watch

    async def task_done_wake(self, task_id: str, timeout_ms: int) -> None:
        self._wake_baseline = None
        await self.claim_wake((), timeout_ms)

    def _register_wakeable(self, queues: Sequence[str]) -> None:
        self._wake_baseline = (self._data_version(), self._local_commits)

    def wake_from_now(self) -> None:
        self._register_wakeable(())

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
            self._last_optimize = time.monotonic()
            refresh_statistics(conn)

    # -- daemon maintenance ------------------------------------------------------------

    async def ensure_schema(self, name: str) -> None:
        # Built on the scan thread, the loop free meanwhile; the write lock is held
        # for the build (SQLite builds an index in one write), about a second per
        # million rows, so workers' writes wait that long once.
        async with self._write_locked() as conn:
            for text in on_demand("sqlite", name):
                await self._stepped(conn, conn.execute, text)

    async def after_purge(self, *, wait: bool = False) -> None:
        """A passive WAL checkpoint: keeps the WAL small after a purge without waiting
        on (or stalling) any reader or writer. Quick, so always done before returning."""
        await self._fetch("wal_checkpoint", {})


#: Writes of one task by id that return the whole row (`returning *`), as `get` does.
_ONE_ROW_WRITES = frozenset(
    {"cancel", "retry", "fail", "complete", "succeed", "progress", "heartbeat"}
)


def is_undecodable_text(exc: BaseException) -> bool:
    """`sqlite3` refusing to fetch a row whose text is not UTF-8."""
    return isinstance(exc, sqlite3.OperationalError) and str(exc).startswith(
        "Could not decode to UTF-8"
    )


@contextlib.contextmanager
def _tolerant(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """`conn` reading text that is not UTF-8 as `UndecodableText`, for the block (the
    in-process lock held: nothing else uses the connection meanwhile)."""
    conn.text_factory = tolerant_text
    try:
        yield conn
    finally:
        conn.text_factory = str
