"""`PostgresStore`: the protocol on Postgres through psycopg 3 (async): the database's
clock in every statement, the public SDKs' advisory key lock, JSON decoded once, a pool
in autocommit mode, and pooler modes (docs/architecture.md, "The Postgres store").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool

from cairnqd._ids import new_task_ids
from cairnqd._jsoncodec import dump_json, load_json_or_marker
from cairnqd._protocol import Statement, on_demand, statement
from cairnqd.config import redact_dsn
from cairnqd.errors import (
    DatabaseUnavailable,
    LostLease,
    MigrationsPending,
    SchemaMismatch,
)
from cairnqd.models import Task
from cairnqd.store.base import Clock, OneDraw, Params, Row, Session, TaskStore
from cairnqd.store.callers import in_sync_submit
from cairnqd.store.coalesce import SubmitCoalescer
from cairnqd.store.dependencies import item_refs
from cairnqd.store.executor import UserWrite
from cairnqd.store.limits import RoomFlight
from cairnqd.store.migrate import check_protocol_version
from cairnqd.store.postgres.bulk import STREAM_FROM, stream_tasks
from cairnqd.store.postgres.callerpool import CallerPool, caller_pool, check_open, lent, pool_dsn
from cairnqd.store.postgres.callertx import (
    Identity,
    caller_session,
    identity_now,
    plain_session,
    store_identity,
)
from cairnqd.store.postgres.connect import (
    BACKSTOP_S,
    AsyncConn,
    Reachability,
    answer_within,
    bind,
    check_pooler,
    connect_kwargs,
    is_unreachable,
    returned_rows,
    run,
    session_conninfo,
    shut_socket,
)
from cairnqd.store.postgres.flight import Step, claim_in_one_flight
from cairnqd.store.postgres.leadership import PostgresLeadership
from cairnqd.store.postgres.lease import new_holder
from cairnqd.store.postgres.listen import ANY, PROBE_EVERY_S, Listener, RelayedWakes
from cairnqd.store.postgres.migrate import apply_postgres, drop_invalid_index, pending_postgres
from cairnqd.store.statement_params import claim_variant, for_attempt

T = TypeVar("T")

log = logging.getLogger("cairnqd.store")

# Rows a scan decodes before letting the loop run: ~2 ms for a typical task row.
_SCAN_CHUNK = 128
#: Longest a store operation may take on our side before its connection is dropped.
DEFAULT_CALL_TIMEOUT_S = 60.0
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")
# The index an on-demand `create index ... if not exists NAME` makes.
_DOLLAR_PARAM = re.compile(r"\$(\d+)")
#: How often a pool connection drops the query plans it has cached (docs/architecture.md,
#: "Cached plans on a growing table"), with the BEGIN of its next transaction; a new
#: connection first after `REPLAN_FIRST_S`, then at twice the interval each time up to
#: `REPLAN_EVERY_S`, so a plan made on a young table does not last.
REPLAN_EVERY_S = 5.0
REPLAN_FIRST_S = 0.5
#: How long the close of a severed store (`sever`) waits for the pool's workers.
SEVERED_CLOSE_S = 0.2


class PostgresStore(TaskStore):
    dialect = "postgres"
    json_is_text = False

    def __init__(
        self,
        dsn: str | CallerPool,
        *,
        min_size: int = 1,
        max_size: int = 10,
        schema: str | None = None,
        connect_timeout_s: float = 10.0,
        migrate: bool = True,
        listen: bool = True,
        statement_timeout_ms: int | None = None,
        call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S,
        clock: Clock | None = None,
        pooler: str = "none",
        direct_dsn: str | None = None,
        relayed: bool = False,
    ) -> None:
        """`statement_timeout_ms` sets the server's `statement_timeout` on every
        connection (the daemon's background threads bound their queries with it).
        `call_timeout_s` bounds each operation on our side (None: unbounded); see
        `_borrow`. `clock` moves the retention cut-offs only; see `Clock`.

        `pooler`: what `dsn` reaches Postgres through: "none", or a pooler in
        "session" or "transaction" mode. `direct_dsn`: behind a pooler, a DSN that
        reaches Postgres directly, used for LISTEN, leadership and migrations.
        `relayed`: queued-work wake-ups come from `relay_wake` (a daemon child's
        parent passes them on) instead of a LISTEN of this store's own.

        `dsn` may instead be a psycopg_pool `AsyncConnectionPool` the caller owns: the
        store borrows its connections and never opens or closes it; its own sessions
        are opened from the pool's connection parameters (callerpool.py)."""
        #: The caller's pool, when one was given: used, never opened or closed here.
        self._provided = caller_pool(dsn)
        if self._provided is not None:
            given = self._provided.conninfo
            dsn = given if isinstance(given, str) else ""
            describe = f"Postgres store on your pool {self._provided.name!r} {redact_dsn(dsn)}"
        else:
            assert isinstance(dsn, str)
            describe = f"Postgres store {redact_dsn(dsn)}"
        super().__init__(clock=clock, describe=describe.rstrip())
        self.pooler = check_pooler(pooler)
        if schema is not None and pooler == "transaction":
            raise ValueError(
                "schema= needs a session setting (search_path), which a transaction pooler "
                "does not keep; set the role's search_path instead "
                "(ALTER ROLE ... SET search_path = ...)"
            )
        self.direct_dsn = direct_dsn
        # False: no LISTEN connection (a process that never waits on wake-ups, such
        # as the daemon's parent or the CLI, should not hold one).
        self.listen = listen
        # False: refuse a database with pending migrations instead of applying them.
        self.migrate = migrate
        if schema is not None and not _SCHEMA_NAME.match(schema):
            raise ValueError(f"schema must match {_SCHEMA_NAME.pattern}, got {schema!r}")
        if min_size < 1 or max_size < min_size:
            raise ValueError(f"need 1 <= min_size <= max_size, got {min_size}, {max_size}")
        self.statement_timeout_ms = statement_timeout_ms
        self.connect_timeout_s = connect_timeout_s
        self._address(dsn)
        # Behind a pooler, or on the caller's connections (whose session settings are
        # theirs), the statement timeout is set per transaction (SET LOCAL).
        local = pooler != "none" or self._provided is not None
        self._local_timeout_ms = statement_timeout_ms if local else None
        self.schema = schema
        self.min_size = min_size
        self.max_size = max_size
        if call_timeout_s is not None and call_timeout_s <= 0:
            raise ValueError(f"call_timeout_s must be positive or None, got {call_timeout_s}")
        self.call_timeout_s = call_timeout_s
        self._pool: AsyncConnectionPool[AsyncConn] | None = None
        #: When each pool connection last dropped its cached plans (`_begin_steps`),
        #: and how often it has.
        self._replanned_at: weakref.WeakKeyDictionary[AsyncConn, tuple[float, int]] = (
            weakref.WeakKeyDictionary()
        )
        self.replan_first_s = REPLAN_FIRST_S
        self.replan_every_s = REPLAN_EVERY_S
        #: The connections borrowed by calls in flight (`sever`).
        self._busy: set[AsyncConn] = set()
        #: Whether `sever` cut calls short since the store last opened.
        self._severed = False
        # Concurrent keyless submits share one statement and one commit. Its writer
        # writes for callers admitted and waiting, so it passes while the store closes.
        self.submits = SubmitCoalescer(
            self.barrier.on_behalf(self._insert_one),
            self.barrier.on_behalf(self._insert_many_keyless),
        )
        self._listeners: dict[str, Listener] = {}
        self._push_hint = False
        self._push_off_logged = False
        self._relay = RelayedWakes() if relayed else None
        #: How often each LISTEN proves again that it hears (store/postgres/listen.py).
        self.listen_probe_every_s = PROBE_EVERY_S
        # Who this store is when it takes turns (`take_turn`): the same for its life.
        self._holder = new_holder()
        #: Whether the server answers this store's calls (see `_borrow`).
        self.reachability = Reachability()
        # The VACUUM `after_purge` started in the background, while it runs.
        self._vacuum: asyncio.Task[None] | None = None
        #: Names the database install, for checking a caller's `tx=` (callertx.py).
        self._database_identity: Identity | None = None
        #: Our connections a `succeed_in` write holds now (its `tx=` needs no check).
        self._lent_to_writes: weakref.WeakSet[AsyncConn] = weakref.WeakSet()

    # -- connect / close ---------------------------------------------------------------

    def _address(self, dsn: str, **options: Any) -> None:
        """Where the store's connections go: `dsn` plus our session settings, and
        where sessions of our own go (LISTEN, session locks, migrations): the direct
        DSN, else the pooled one unless a transaction pooler would lose their state.
        `options`: connection options beyond the pooler's (a caller's pool's)."""
        self.dsn = dsn
        self.conninfo = session_conninfo(
            dsn,
            statement_timeout_ms=self.statement_timeout_ms,
            connect_timeout_s=self.connect_timeout_s,
            pooler=self.pooler,
        )
        self._connect_kwargs = {**connect_kwargs(self.pooler), **options}
        self.session_conninfo: str | None = None
        self._session_kwargs: dict[str, Any] = {}
        if self.direct_dsn is not None:
            self.session_conninfo = session_conninfo(
                self.direct_dsn,
                statement_timeout_ms=self.statement_timeout_ms,
                connect_timeout_s=self.connect_timeout_s,
            )
        elif self.pooler != "transaction":
            self.session_conninfo = self.conninfo
            self._session_kwargs = self._connect_kwargs

    async def _configure(self, conn: AsyncConn) -> None:
        # The stdlib's json.loads spends a good part of a small document's decode on
        # sniffing the encoding of bytes; ours decodes UTF-8 straight away, and marks
        # a value it cannot decode instead of failing every row fetched with it.
        set_json_loads(load_json_or_marker, conn)
        if self.schema is not None:
            # Quoted, so a mixed-case schema name keeps its case.
            await conn.execute(sql.SQL("set search_path to {}").format(sql.Identifier(self.schema)))

    async def dedicated_connection(self, *, direct: bool = False) -> AsyncConn:
        """A new connection outside the pool, configured like the pool's, that the
        caller closes: for connect's checks and the daemon's leadership sessions.
        `direct`: on `direct_dsn` when there is one (migrations, session locks)."""
        conninfo, kwargs = self.conninfo, self._connect_kwargs
        if direct and self.direct_dsn is not None and self.session_conninfo is not None:
            conninfo, kwargs = self.session_conninfo, {}
        try:
            conn = await psycopg.AsyncConnection.connect(
                conninfo,
                autocommit=True,
                row_factory=dict_row,
                connect_timeout=max(1, int(self.connect_timeout_s)),
                **kwargs,
            )
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(
                f"cannot connect to Postgres at {redact_dsn(self.dsn)}: {exc}".strip()
            ) from exc
        if self.schema is not None:
            # Like the ledger table: two processes creating it at once race in the
            # catalog, and the loser's error only means the schema now exists.
            with contextlib.suppress(psycopg.errors.UniqueViolation):
                await conn.execute(
                    sql.SQL("create schema if not exists {}").format(sql.Identifier(self.schema))
                )
        await self._configure(conn)
        return conn

    async def connect(self) -> None:
        """Open the pool (checking and migrating the schema first); concurrent callers
        share one open. First use connects, as the public SDK does, and so does use
        after `close()` has returned."""
        self.barrier.check_open()
        while self._pool is None:
            await self._opener.run(self._connect_now)

    async def _connect_now(self) -> None:
        if self._provided is not None:
            check_open(self._provided)
            conninfo, options = await pool_dsn(self._provided)
            self._address(conninfo, **options)
        async with await self.dedicated_connection(direct=True) as conn:
            await self._check_installation(conn)
            if self.migrate:
                # A session advisory lock means nothing through a transaction pooler: the
                # next statement may run on another server connection.
                sessions = self.pooler != "transaction" or self.direct_dsn is not None
                await apply_postgres(conn, session_locks=sessions)
            elif pending := await pending_postgres(conn):
                raise MigrationsPending(redact_dsn(self.dsn), pending)
            version = await run(conn, statement("postgres", "protocol_version"), {})
            check_protocol_version(int(version[0]["value"]) if version else 0, redact_dsn(self.dsn))
            probe = await conn.execute("""select '"cairnq"'::jsonb as probe""")
            row = await probe.fetchone()
            self.json_is_text = row is not None and row["probe"] == '"cairnq"'
        if self._provided is not None:
            # The caller's connections must reach the installation just checked.
            async with lent(self._provided) as conn:
                await self._check_installation(conn)
            self._pool = self._provided
            self._opened()
            return
        pool: AsyncConnectionPool[AsyncConn] = AsyncConnectionPool(
            self.conninfo,
            min_size=self.min_size,
            max_size=self.max_size,
            kwargs={"autocommit": True, "row_factory": dict_row, **self._connect_kwargs},
            configure=self._configure,
            open=False,
            timeout=self.connect_timeout_s,
            # psycopg_pool retries a lost connection with a delay that doubles for as
            # long as this: after a long outage the next try could come minutes after
            # the network returned. Giving up early instead lets the next call open a
            # connection at once (the pool grows again on demand).
            reconnect_timeout=max(2 * self.connect_timeout_s, 10.0),
        )
        try:
            await pool.open(wait=True, timeout=self.connect_timeout_s)
        except Exception as exc:
            await pool.close()
            raise DatabaseUnavailable(
                f"cannot open a connection pool to {redact_dsn(self.dsn)}: {exc}"
            ) from exc
        self._pool = pool
        self._opened()

    async def _check_installation(self, conn: AsyncConn) -> None:
        """Refuse to build a second, invisible installation beside an existing one."""
        rows = await run(conn, statement("postgres", "installations"), {})
        current = rows[0]["current_schema"] if rows else None
        found = [r["schema"] for r in rows if r["schema"] is not None]
        if self.schema is not None:
            if current != self.schema:
                raise SchemaMismatch(
                    f"configured schema {self.schema!r} but the connection resolves to "
                    f"{current!r}; check search_path and the DSN's options"
                )
            return
        if current is None or not found or current in found:
            return
        raise SchemaMismatch(
            f"cairnq tables exist only in schema(s) {', '.join(found)}, but this "
            f"connection's schema is {current!r}; pass schema= to reach them"
        )

    async def _shut(self) -> None:
        await self._closing()
        await self.barrier.drain()  # what was admitted lands before the pool goes
        await self.submits.drain()
        vacuum, self._vacuum = self._vacuum, None
        if vacuum is not None and not vacuum.done():
            vacuum.cancel()  # psycopg cancels the statement on the server too
            with contextlib.suppress(asyncio.CancelledError):
                await vacuum
        listeners, self._listeners = list(self._listeners.values()), {}
        for listener in listeners:
            await listener.stop()
        if self._relay is not None:
            await self._relay.stop()
        pool, self._pool = self._pool, None
        if pool is not None and pool is not self._provided:
            # Severed, the database is out of reach: a pool worker making a connection
            # would hold the close for its whole connect timeout, so it is left behind.
            await pool.close(timeout=SEVERED_CLOSE_S if self._severed else 5.0)
        self._severed = False

    async def _pool_now(self) -> AsyncConnectionPool[AsyncConn]:
        """The pool, opened first when needed."""
        while self._pool is None:
            await self.connect()
        return self._pool

    # -- primitives --------------------------------------------------------------------

    async def _connection(self) -> AbstractAsyncContextManager[AsyncConn]:
        """A connection of the pool, opened first when needed: ours as it is, or the
        caller's set up for the store while it is lent (callerpool.py)."""
        pool = await self._pool_now()
        return pool.connection() if self._provided is None else lent(self._provided)

    @asynccontextmanager
    async def _borrow(self) -> AsyncIterator[AsyncConn]:
        """A pool connection for one operation, which must end within call_timeout_s.

        The server may stop answering without the socket failing (a hung backend, a
        proxy that holds the connection open): the keepalives never fire, and without
        a deadline of our own the call would wait forever. When the deadline passes
        (or the caller is cancelled) mid-operation, the connection's state is unknown,
        so it is closed rather than returned: the pool opens a fresh one. At the
        deadline the connection's socket is shut (`answer_within`), so a statement
        waiting on the server fails at once: cancelling it instead had psycopg first
        ask the server to cancel it, over a new connection, for up to ~10 s more. A
        statement a working server is still running rolls back once it finds the
        connection gone (one that committed already stays, as with a cancel too late).
        Anything else the operation waits on is cancelled `BACKSTOP_S` later.
        """
        began = time.monotonic()
        deadline = self.call_timeout_s
        try:
            with self._operation():
                async with await self._connection() as conn:
                    self._busy.add(conn)
                    try:
                        if deadline is None:
                            yield conn
                        else:
                            async with answer_within(conn, deadline, backstop_s=BACKSTOP_S):
                                yield conn
                    except BaseException as exc:
                        closable = not conn.closed
                        if isinstance(exc, TimeoutError | asyncio.CancelledError) and closable:
                            await conn.close()
                        raise
                    finally:
                        self._busy.discard(conn)
        except Exception as exc:
            # Any answer from the server (a lost lease, a constraint) proves it is there.
            if is_unreachable(exc):
                self.reachability.failed(exc, since=began)
            else:
                self.reachability.succeeded()
            raise
        self.reachability.succeeded()

    def sever(self) -> int:
        """Shut the sockets of the connections that calls are using (`shut_socket`):
        each call fails at once, and the pool drops its connection. Run on the store's
        event loop."""
        self._severed = True
        return sum(shut_socket(conn) for conn in list(self._busy))

    async def _caller_session(self, tx: object) -> Session:
        return await plain_session(tx, self._identity_of(tx), self.clock)

    def _in_caller_tx(self, tx: object) -> AbstractAsyncContextManager[Session]:
        return caller_session(tx, self._identity_of(tx), self.clock)

    def _identity_of(self, tx: object) -> Callable[[], Awaitable[Identity]] | None:
        """How to check `tx`'s database; None for a connection of our own that a
        handler's `succeed_in` write holds: checking it would borrow a second pool
        connection, which a pool of one (a daemon child's default) does not have."""
        return None if tx in self._lent_to_writes else self._identity

    async def _identity(self) -> Identity:
        """What names this store's database install, read once (`callertx.py`): on a
        pool connection, or, for a sync submit (which may not wait on the loop), on a short-lived
        connection of its own."""
        if self._database_identity is None:
            if in_sync_submit():
                self._database_identity = identity_now(
                    self.dsn, schema=self.schema, **self._connect_kwargs
                )
            else:
                async with self._borrow() as conn:
                    self._database_identity = await store_identity(conn)
        return self._database_identity

    async def _insert_keyless(self, params: Params) -> Task:
        return await self.submits.submit(params)

    async def submit_many(
        self, tasks: Sequence[Mapping[str, Any]], *, tx: object = None
    ) -> list[Task]:
        items = tasks if isinstance(tasks, list | tuple) else list(tasks)
        if (
            tx is None
            and self._gate is None
            and len(items) > STREAM_FROM
            and item_refs(items) is None
        ):
            return await self._submit_many_streamed(items)
        return await super().submit_many(items, tx=tx)

    async def _submit_many_streamed(self, items: Sequence[Mapping[str, Any]]) -> list[Task]:
        """`submit_many` of a long list: its keyless runs streamed by COPY while the
        client checks the items that follow (store/postgres/bulk.py). Still one transaction,
        all or nothing: a bad item found after earlier rows went in rolls them back
        before it raises. Every task carries one clock reading, taken first."""
        ids = new_task_ids(len(items))
        with self._operation():
            async with self._begun() as conn:
                session = _PgSession(conn, self.clock)
                now_ms = int((await session.fetch("clock_ms", {}))[0]["now_ms"])

                async def submit_keyed(params: Params) -> Task:
                    return await self._submit_keyed(session, params)

                return await stream_tasks(conn, items, ids, now_ms, submit_keyed)

    async def _fetch(
        self, op: str, params: Params, supplied: frozenset[str] = frozenset()
    ) -> list[Row]:
        stmt = statement("postgres", op, supplied)
        if self._local_timeout_ms is not None:
            async with self._begun() as conn:
                return await run(conn, stmt, params, self.clock)
        async with self._borrow() as conn:
            return await run(conn, stmt, params, self.clock)

    async def _scan(
        self,
        op: str,
        params: Params,
        supplied: frozenset[str],
        convert: Callable[[list[Row]], list[T]],
    ) -> list[T]:
        # psycopg decodes rows (jsonb included) as they are fetched: fetch a chunk at a
        # time and let the loop run between chunks.
        stmt = statement("postgres", op, supplied)
        out: list[T] = []
        borrow = self._borrow if self._local_timeout_ms is None else self._begun
        async with borrow() as conn:
            cursor = await conn.execute(stmt.text, bind(stmt, params, self.clock))
            while True:
                rows: list[Row] = list(await cursor.fetchmany(_SCAN_CHUNK))
                out.extend(convert(rows))
                if len(rows) < _SCAN_CHUNK:
                    return out
                await asyncio.sleep(0)

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Session]:
        async with self._begun() as conn:
            yield _PgSession(conn, self.clock)

    @asynccontextmanager
    async def _begun(self) -> AsyncIterator[AsyncConn]:
        """A pool connection inside a transaction, committed when the block ends."""
        async with self._borrow() as conn:
            # BEGIN/COMMIT by hand rather than conn.transaction(): when the deadline
            # cancels us mid-transaction, a ROLLBACK would wait on the same silent
            # server, so the connection is closed instead (the server rolls back).
            if self._local_timeout_ms is None:
                await conn.execute("; ".join(self._begin_steps(conn)))
            else:
                # One round trip (no parameters: the simple query protocol). Behind a
                # pooler this is the only way a timeout reaches the statements.
                await conn.execute(
                    f"begin; set local statement_timeout = {int(self._local_timeout_ms)}"
                )
            try:
                yield conn
            except BaseException:
                task = asyncio.current_task()
                if not conn.closed and not (task is not None and task.cancelling()):
                    with contextlib.suppress(psycopg.Error):
                        await conn.execute("rollback")
                raise
            await conn.execute("commit")

    async def _claim_flight(
        self,
        queues: list[str],
        base: Params,
        single: OneDraw,
        settle_params: Params | None,
        room: RoomFlight | None,
    ) -> tuple[list[Row], dict[str, str]] | None:
        if self._local_timeout_ms is not None or self.pooler == "transaction":
            return None  # behind a transaction pooler, one statement at a time
        steps: list[Step] = []
        if settle_params is not None:
            steps.append((statement("postgres", "complete_many"), settle_params))
            if room is not None:
                # Their room is back for the draw after it (as `_claim_in` does).
                steps.append(
                    (statement("postgres", "extensions/limit_slots_release"), settle_params)
                )
        if room is not None:
            steps.append((room.statement, room.params))
        else:
            op, params = claim_variant(queues, single.names)
            steps.append((statement("postgres", op), {**base, **params, "limit": single.limit}))
        async with self._borrow() as conn:
            begin = self._begin_steps(conn)
            if begin == ("begin",):
                # No BEGIN and COMMIT around the statements (flight.py's docstring):
                # the claim alone is one UPDATE, a transaction by itself, sent without
                # a pipeline (a third less of the client's CPU per claim); with results
                # before it, the statements sent up to one Sync are one transaction
                # all the same. A worker keeping up with a stream makes one of these
                # for every task or two (bench/RESULTS.md, "Under a steady stream").
                begin = ()
            answers = await claim_in_one_flight(conn, begin, steps, base["worker_id"], self.clock)
        settled = {r["id"]: r["status"] for r in answers[0]} if settle_params is not None else {}
        return answers[-1], settled

    def _begin_steps(self, conn: AsyncConn) -> tuple[str, ...]:
        """BEGIN, led by DISCARD PLANS once every `replan_every_s` per connection (sent
        together either way: one simple query, or in a claim's flight). A prepared
        statement's generic plan is made once, for the table as it was: the claim's,
        made while cairnq_tasks was nearly empty, reads the whole table by sequential
        scan for every claim as it grows, and only an ANALYZE (autovacuum) would have it
        planned again. Dropping the plans has the next executions plan for the table as
        it is now: soon after the connection opens, when the table it first planned for
        may be young and growing fast, then less often."""
        now = time.monotonic()
        last, times = self._replanned_at.setdefault(conn, (now, 0))
        interval = min(self.replan_every_s, self.replan_first_s * 2**times)
        if now - last < interval:
            return ("begin",)
        self._replanned_at[conn] = (now, times + 1)
        return ("discard plans", "begin")

    # -- push wake-ups -------------------------------------------------------------------

    def _push(self, channel: str) -> Listener | RelayedWakes | None:
        """The listener for `channel`, started on first use; None when push is off."""
        if self._relay is not None:
            return self._relay if channel == "cairnq_queued" else None
        if self._pool is None or not self.listen:
            return None
        if self.session_conninfo is None:
            if not self._push_off_logged:
                self._push_off_logged = True
                log.info(
                    "push wake-ups off: LISTEN does not work through a transaction pooler "
                    "and no direct_dsn is set; polling instead"
                )
            return None
        listener = self._listeners.get(channel)
        if listener is None:
            listener = self._listeners[channel] = Listener(
                self.session_conninfo,
                channel,
                connect_timeout_s=self.connect_timeout_s,
                connect_kwargs=self._session_kwargs,
                send_notify=self.send_notify,
                probe_every_s=self.listen_probe_every_s,
            )
            listener.start()
        return None if listener.disabled else listener

    def relay_wake(self, queues: Sequence[str]) -> None:
        """Work was queued on `queues` (told by the process that LISTENs for us)."""
        if self._relay is not None:
            self._relay.wake(queues)

    async def send_notify(self, channel: str, payload: str) -> None:
        """NOTIFY `channel` through `dsn` (the pooler, if any), the way a task's
        notification travels, so a listener's proving NOTIFY meets whatever a task's
        would (store/postgres/listen.py). On a short-lived connection of its own, never a
        pool one: a worker's pool may hold one connection, which its claims need."""
        async with asyncio.timeout(self.call_timeout_s):
            conn = await psycopg.AsyncConnection.connect(
                self.conninfo,
                autocommit=True,
                connect_timeout=max(1, int(self.connect_timeout_s)),
                **self._connect_kwargs,
            )
            async with conn:
                await conn.execute("select pg_notify(%s, %s)", (channel, payload))

    @property
    def push_state(self) -> str:
        """How this store's waiters wake: "on" (a LISTEN that heard its own NOTIFY, or
        none opened yet), "deaf" (a LISTEN accepted but deaf: polling), "off" (no
        LISTEN by design: polling), "relayed" (wake-ups come from `relay_wake`)."""
        if self._relay is not None:
            return "relayed"
        if not self.listen or self.session_conninfo is None:
            return "off"
        if any(listener.deaf for listener in self._listeners.values()):
            return "deaf"
        return "on"

    def _register_wakeable(self, queues: Sequence[str]) -> None:
        listener = self._push("cairnq_queued")
        if listener is not None:
            listener.sticky(queues)

    async def claim_wake(self, queues: Sequence[str], timeout_ms: int) -> None:
        timeout_s = max(0, timeout_ms) / 1000
        listener = self._push("cairnq_queued")
        if listener is None:
            await asyncio.sleep(timeout_s)
            return
        events = listener.sticky(queues)
        room = self._room_wakes()
        if room is not None:
            events = [*events, room]
        if not await listener.until_listening(timeout_s):
            return
        if not any(e.is_set() for e in events):
            waits = [asyncio.ensure_future(e.wait()) for e in events]
            try:
                # The first flag ends the wait: any one of the queues, or the room.
                await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        # Woken by a notification for one of these queues: the claim that follows
        # can skip its probe, one round trip less on the way to the handler.
        self._push_hint = any(e.is_set() for e in events) and listener.connected.is_set()
        for event in events:
            event.clear()

    def _room_wakes(self) -> asyncio.Event | None:
        """While a limit holds this store's claims back for want of room: a flag that
        any task's settling sets (the `cairnq_done` LISTEN, or a daemon child's parent
        relaying it), since that may be the room (docs/limits.md). None otherwise, or
        with neither."""
        if self.limited is None or not self.limited.waiting_for_room:
            return None
        if self._relay is not None:
            # A daemon child's parent passes on that tasks settled (wakerelay.py).
            return self._relay.sticky([ANY])[0]
        done = self._push("cairnq_done")
        if not isinstance(done, Listener):
            return None
        return done.sticky([ANY])[0]

    def _settling(self, task_ids: Sequence[str]) -> None:
        done = self._listeners.get("cairnq_done")  # never started for this alone
        if done is not None:
            done.expect_own(task_ids)

    def _take_push_hint(self, queues: Sequence[str]) -> bool:
        hint, self._push_hint = self._push_hint, False
        listener = self._push("cairnq_queued")
        if listener is None or not listener.connected.is_set():
            return hint
        # Claims back to back (a worker keeping up with a stream) never wait in
        # claim_wake, which clears the flags: a flag set since the last claim began is
        # a task that claim may not have seen. Cleared now, before this claim's
        # snapshot: what is set from here on is news for the next one.
        for event in listener.sticky(queues):
            hint = hint or event.is_set()
            event.clear()
        return hint

    async def task_done_wake(self, task_id: str, timeout_ms: int) -> None:
        timeout_s = max(0, timeout_ms) / 1000
        listener = self._push("cairnq_done")
        if not isinstance(listener, Listener):
            await asyncio.sleep(timeout_s)
            return
        if await listener.until_listening(timeout_s):
            await listener.wait_once(task_id, timeout_s)

    async def _lock_key(self, session: Session, key: str) -> None:
        await session.fetch("lock_key", {"key": key})

    async def complete_in(
        self, *, task_id: str, worker_id: str, write: UserWrite, attempt: int | None = None
    ) -> tuple[Task, Any]:
        """Run the caller's writes and the settlement in one transaction: a lost lease
        rolls back both, so there is no window where one landed without the other.
        No call deadline here: how long the caller's own writes may take is theirs to
        say (the connection's keepalives still catch a dead peer)."""
        with self._operation():
            async with await self._connection() as conn, conn.transaction():
                return await self._complete_in(conn, task_id, worker_id, write, attempt)

    async def _complete_in(
        self,
        conn: AsyncConn,
        task_id: str,
        worker_id: str,
        write: UserWrite,
        attempt: int | None,
    ) -> tuple[Task, Any]:
        if self._local_timeout_ms is not None:
            await conn.execute(f"set local statement_timeout = {int(self._local_timeout_ms)}")
        self._lent_to_writes.add(conn)
        try:
            value = await write(UserSession(conn))
        finally:
            self._lent_to_writes.discard(conn)
        encoded = None if value is None else dump_json(value, what="result")
        params, supplied = for_attempt(
            {"id": task_id, "worker_id": worker_id, "result": encoded}, attempt
        )
        rows = await run(conn, statement("postgres", "complete", supplied), params)
        if not rows:
            raise LostLease(task_id)
        return self._task(rows[0]), value

    # -- daemon maintenance ------------------------------------------------------------

    async def server_connection_limits(self) -> tuple[int, int]:
        """(max_connections, superuser_reserved_connections) of the server. Works on a
        store that is not connected: the daemon asks before anything is migrated.
        On `direct_dsn` when there is one: a pooler may answer for itself."""
        async with await self.dedicated_connection(direct=True) as conn:
            rows = await run(conn, statement("postgres", "connection_limits"), {})
        return int(rows[0]["max_connections"]), int(rows[0]["reserved"])

    @functools.cached_property
    def leadership(self) -> PostgresLeadership:
        """Advisory locks on sessions of their own (`mode` "session", on `direct_dsn`
        when given), or rows in cairnqd_leases (`mode` "lease", behind a transaction
        pooler without `direct_dsn`)."""
        return PostgresLeadership(
            mode="session" if self.session_conninfo is not None else "lease",
            open_session=self._session,
            lease_fetch=self._lease_fetch,
            holder=self._holder,
            timeout_s=self.call_timeout_s,
        )

    async def _session(self) -> AsyncConn:
        return await self.dedicated_connection(direct=True)

    async def _lease_fetch(self, op: str, params: Mapping[str, Any]) -> list[Row]:
        return await self._fetch(op, dict(params))

    async def ensure_schema(self, name: str) -> None:
        # `create index concurrently` cannot run in a transaction: a connection of its
        # own in autocommit, on direct_dsn when there is one. A build cancelled midway
        # leaves an invalid index that `if not exists` would keep: dropped and rebuilt.
        conn = await self.dedicated_connection(direct=True)
        async with conn:
            if self.pooler == "none" or self.direct_dsn is not None:
                # This connection carries the role's statement timeout (a background
                # one of seconds); a build on a large table takes longer, and that is
                # fine. Behind a pooler the timeout is per transaction: nothing to lift.
                await conn.execute("set statement_timeout = 0")
            for text in on_demand("postgres", name):
                await drop_invalid_index(conn, text)
                await conn.execute(text)

    async def database_now_ms(self) -> int:
        """The server's clock (`clock_ms`), which every lease and `run_at_ms` is read
        against; an injected clock wins, as it does for the statements."""
        if self.clock is not None:
            return self.clock()
        rows = await self._fetch("clock_ms", {})
        return int(rows[0]["now_ms"])

    async def after_purge(self, *, wait: bool = False) -> None:
        """VACUUM (and ANALYZE) the task tables when autovacuum is off and their dead
        rows passed its threshold (protocol/extensions/sql/postgres/vacuum_due.sql says
        why it matters). Plain VACUUM takes no lock that stops claims or submits.

        It runs in the background unless `wait`: on a bloated table it takes minutes,
        and the daemon's maintenance loop must go on handing back tasks and reaping
        leases meanwhile. At most one runs at a time; `close()` cancels it."""
        if self._vacuum is not None and not self._vacuum.done():
            return
        rows = await self._fetch("vacuum_due", {})
        if not rows or not rows[0]["due"]:
            return
        self._vacuum = asyncio.create_task(self._vacuum_tables(int(rows[0]["dead_rows"])))
        if wait:
            await self._vacuum

    async def _vacuum_tables(self, dead_rows: int) -> None:
        # VACUUM cannot run inside a transaction: a connection of its own, in autocommit,
        # on direct_dsn when there is one, without the role's statement timeout.
        began = time.monotonic()
        try:
            conn = await self.dedicated_connection(direct=True)
            async with conn:
                if self.pooler == "none" or self.direct_dsn is not None:
                    await conn.execute("set statement_timeout = 0")
                await conn.execute("vacuum (analyze) cairnq_tasks, cairnq_task_keys")
        except (psycopg.Error, DatabaseUnavailable) as exc:
            log.warning("autovacuum is off, and the VACUUM after the purge failed: %s", exc)
            return
        log.info(
            "autovacuum is off: vacuumed cairnq_tasks after the purge (%d dead rows, %.1f s)",
            dead_rows,
            time.monotonic() - began,
        )


class _PgSession:
    def __init__(self, conn: AsyncConn, clock: Clock | None) -> None:
        self.connection = conn
        self._clock = clock

    async def fetch(
        self, op: str, params: Params, supplied: frozenset[str] = frozenset()
    ) -> list[Row]:
        return await run(self.connection, statement("postgres", op, supplied), params, self._clock)

    async def fetch_statement(self, stmt: Statement, params: Params) -> list[Row]:
        return await run(self.connection, stmt, params, self._clock)


class UserSession:
    """What `succeed_in` hands to the caller's `write`: the public SDK's PgSession
    shape (`query(text, values)` with `$n` placeholders, `execute(sql)`), over the
    transaction's connection."""

    def __init__(self, conn: AsyncConn) -> None:
        self.connection = conn

    async def query(self, text: str, values: Sequence[Any] = ()) -> list[dict[str, Any]]:
        sql = _DOLLAR_PARAM.sub(lambda m: f"%(p{m.group(1)})s", text.replace("%", "%%"))
        named = {f"p{i}": v for i, v in enumerate(values, start=1)}
        cursor = await self.connection.execute(sql, named)
        return await cursor.fetchall() if returned_rows(cursor) else []

    async def execute(self, sql: str) -> None:
        await self.connection.execute(sql)
