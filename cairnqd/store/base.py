"""`TaskStore`: every protocol operation, written once over its dialect's primitives.

Every decision the protocol makes (validation, conflict strategies, claim variants, what
each write returns) lives here, so the dialects cannot drift apart. An operation passes
every value any dialect might bind (relative times such as `lease_ms`); the dialect
derives what its statement names (SQLite's absolute `now_ms`, ...) at bind time.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import functools
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from cairnqd._ids import new_task_ids, task_id_floor
from cairnqd._jsoncodec import dump_json, markers_made
from cairnqd._protocol import Dialect
from cairnqd.errors import (
    AlreadyExists,
    ErrorEnvelope,
    LostLease,
    SerializationError,
    UndecodableRow,
    UnsupportedBackend,
)
from cairnqd.models import STATUSES, Task, TaskRef, undecodable_column
from cairnqd.store.admission import Admission, CloseBarrier, SharedOpen
from cairnqd.store.arguments import (
    INT8_MAX,
    Params,
    check_page,
    check_status_filter,
    check_terminal_status,
    check_text,
    insert_params_for,
    optional_filters,
    require_duration,
    require_int,
    require_number,
    require_str,
    submit_params,
)
from cairnqd.store.callers import driver_connection
from cairnqd.store.clockstep import WallClockWatch
from cairnqd.store.dependencies import (
    GRAPH_LIMIT,
    ItemRef,
    TaskGraph,
    hold,
    item_refs,
    missing_parent,
    missing_parents,
    parent_ids,
    without_after,
)
from cairnqd.store.executor import Row, Session, UserWrite
from cairnqd.store.leadership import SOLE_HOST, Leadership
from cairnqd.store.limits import RECLAIM_EVERY_S, RoomFlight
from cairnqd.store.statement_params import (
    INSERT_MANY_CHUNK,
    LEASE_EXPIRED,
    LEASE_EXPIRED_ERROR_JSON,
    SettleItem,
    claim_variant,
    complete_many_params,
    encode_error,
    for_attempt,
    insert_many_params,
    new_task,
)
from cairnqd.store.tables.attempts import (
    HAND_BACK_OUTCOMES,
    AttemptHistory,
    close_interrupted,
    name_hand_back,
)
from cairnqd.store.tables.bulk_actions import BulkActions
from cairnqd.store.tables.dashboard import DashboardReads
from cairnqd.store.tables.fleet import FleetRegistry
from cairnqd.store.tables.pauses import QueuePauses
from cairnqd.store.tables.queue_counts import QueueCounts
from cairnqd.store.tables.reports import DaemonReports

if TYPE_CHECKING:
    from cairnqd.limits import Limit
    from cairnqd.store.backpressure import QueueDepthGate
    from cairnqd.store.limits import LimitedClaims
    from cairnqd.store.tables.limits import LimitTable

T = TypeVar("T")

log = logging.getLogger("cairnqd.store")

_LIVE = frozenset({"queued", "running"})
# Which existing task each conflict strategy hands back instead of inserting.
_REUSABLE: dict[str, frozenset[str]] = {
    "reuse": _LIVE,
    "reuse-succeeded": _LIVE | {"succeeded"},
    "replace": frozenset(),
    "reject": frozenset(),
}


class StoreExecutor:
    """The `Executor` (store/executor.py) of one store: its dialect's primitives, for
    the table classes above it."""

    def __init__(self, store: TaskStore) -> None:
        self._store = store

    @property
    def dialect(self) -> Dialect:
        return self._store.dialect

    async def fetch(
        self, op: str, params: Params, supplied: frozenset[str] = frozenset()
    ) -> list[Row]:
        return await self._store._fetch(op, params, supplied)

    async def scan(
        self,
        op: str,
        params: Params,
        supplied: frozenset[str],
        convert: Callable[[list[Row]], list[T]],
    ) -> list[T]:
        return await self._store._scan(op, params, supplied, convert)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Session]:
        store = self._store
        with store._operation():
            async with store._transaction() as session:
                yield session

    async def replayable(self, work: Callable[[Session], Awaitable[T]]) -> T:
        return await self._store._replayable(work)

    def operation(self) -> AbstractContextManager[None]:
        return self._store._operation()

    def tasks(self, rows: Sequence[Row]) -> list[Task]:
        return self._store._tasks(rows)


Clock = Callable[[], int]
"""Epoch milliseconds. SQLite binds a store's clock into every statement that reads the
time; Postgres reads the server's clock instead, and an injected clock only moves the
retention cut-offs (`purge`, `count_purgeable`): enough to age rows in a test without
waiting, while leases and due times stay on the one clock all hosts share."""


class Sweeper(Protocol):
    """A helper that runs beside an open store, such as the SDK's `Retention` sweeper:
    started once the store's connection is open, stopped before it closes."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class ClaimDraw(Protocol):
    """One draw of a claim session: the claimed rows (rows, not tasks: decoding them
    waits until the transaction has committed)."""

    async def __call__(
        self, names: Sequence[str] | None, limit: int, ready: int | None = None
    ) -> list[Row]:
        """Up to `limit` tasks named `names` (None: any). `ready`: how many of them can
        start at once (the worker's free slots; the rest wait, prefetched); a task a
        flow-control limit covers is claimed only to start at once. None: all."""
        ...


ClaimPlanFn = Callable[[ClaimDraw], Awaitable[Sequence[Row]]]


@dataclasses.dataclass(frozen=True)
class OneDraw:
    """A claim plan's only draw, known before its transaction opens: up to `limit`
    tasks named `names` (None: any). A plan that can say so (a `one_draw()` method
    returning it, or None when it draws otherwise) lets a dialect send the whole claim
    transaction at once (`TaskStore._claim_flight`)."""

    names: Sequence[str] | None
    limit: int


def one_draw_of(plan: ClaimPlanFn) -> OneDraw | None:
    offer: Callable[[], OneDraw | None] | None = getattr(plan, "one_draw", None)
    return None if offer is None else offer()


class _SingleDraw:
    """The plan of `TaskStore.claim`: one draw of `limit` tasks named `names`."""

    def __init__(self, names: Sequence[str] | None, limit: int) -> None:
        self._draw = OneDraw(names, limit)

    async def __call__(self, draw: ClaimDraw) -> list[Row]:
        return await draw(self._draw.names, self._draw.limit)

    def one_draw(self) -> OneDraw | None:
        names, limit = self._draw.names, self._draw.limit
        return None if limit <= 0 or (names is not None and not names) else self._draw


@dataclasses.dataclass(frozen=True)
class QuarantinedRow:
    """A row a claim took and could not decode, failed without running: what
    `TaskStore.on_undecodable` receives. `id`, `queue` and `name` are as stored, any
    byte that is not UTF-8 escaped; `failed` is False when the row was no longer this
    worker's to fail (its lease had gone: recovery returns it to a claim, which meets
    it again)."""

    id: str
    queue: str
    name: str
    attempt: int | None
    error: UndecodableRow
    failed: bool


#: A claim that finds work recovers expired leases at most this often; one that finds
#: none recovers at once and draws again. The protocol has every claim recover first;
#: doing it on every cycle of a busy worker, or of one keeping up with a steady stream
#: a few tasks a claim, cost a statement per cycle for a scan that almost always finds
#: nothing (the daemon's reaper and idle claims still recover within a second of need).
CLAIM_RECOVERY_EVERY_S = 1.0
#: A claim that finds nothing recovers expired leases at once, unless a claim of this
#: store did within this long: the daemon's children all wake for each notification
#: and all but one find nothing, and under a stream a sixth of a bare worker's claims
#: do (a notification announcing a task the claim before took). Each such recovery
#: was a statement of its own, a third of what an empty wake-up cost a worker. A lease
#: that expired meanwhile is recovered by the next empty claim past this gap, the
#: next probe-led claim, or the once-a-second pace.
EMPTY_CLAIM_RECOVERY_GAP_S = 0.1


def prepare_items(
    items: Sequence[Mapping[str, Any]], ids: Sequence[str], start: int, stop: int
) -> list[Params]:
    """The insert parameters of `items[start:stop]`, item i under `ids[i]` (the whole
    list's ids, made at once by `new_task_ids`, so they ascend in list order); a bad
    item raises, naming its index in the whole list."""
    prepared: list[Params] = []
    for index in range(start, min(stop, len(items))):
        item = items[index]
        if not isinstance(item, Mapping):
            raise ValueError(f"tasks[{index}] must be a mapping of submit arguments")
        try:
            prepared.append(insert_params_for(item, ids[index]))
        except TypeError as exc:
            raise ValueError(f"tasks[{index}]: {exc}") from None
        except (ValueError, SerializationError) as exc:
            raise type(exc)(f"tasks[{index}]: {exc}") from None
    return prepared


def inserted_tasks(run: Sequence[Params], now_ms: int) -> list[Task]:
    """The tasks an insert of `run` made at `now_ms`: what was inserted, created then
    and due then plus each task's delay."""
    return [new_task(p, now_ms + p["delay_ms"], now_ms) for p in run]


class TaskStore(ABC):
    """One connection (or pool) to one cairnq database."""

    dialect: Dialect
    # How this driver returns JSON columns: text to parse (SQLite), or decoded values.
    json_is_text: bool = True
    #: Seconds a long purge waits between two batches, so the workers' writes get in
    #: (SQLite has one writer); 0 where writers do not queue behind each other.
    purge_batch_pause_s: float = 0.0
    #: Whether a write transaction, once begun, runs to its commit without waiting on
    #: anything: no round trip, no other process. Then results lose next to nothing by
    #: riding in a claim that reaches ahead, and committing them first would cost a
    #: second commit per cycle (`ClaimLoop._claim` decides by it).
    brief_transactions: bool = False
    #: Whether all write transactions, every process's, take turns at one lock
    #: (SQLite): a claim that finds nothing still holds up every other writer.
    one_writer: bool = False

    def __init__(self, *, clock: Clock | None = None, describe: str = "store") -> None:
        #: Admits operations, and refuses them while `close()` drains (store/admission.py).
        self.barrier = CloseBarrier(describe)
        self._closer = SharedOpen()
        #: The dialect's open (`connect`), shared by the callers that need it at once.
        self._opener = SharedOpen()
        # Injected: what this store's statements read as now (see Clock). Kept apart
        # from now_ms so a dialect with a clock of its own knows when it is overridden.
        self.clock = clock
        self.now_ms: Clock = clock if clock is not None else wall_clock_ms
        self._gate: QueueDepthGate | None = None
        #: Flow-control limits this store's claims keep (store/limits.py); None: the
        #: protocol's claim statements, as they are.
        self.limited: LimitedClaims | None = None
        self._retention: Sweeper | None = None
        self._claim_recovered_at = -math.inf
        #: How often a claim that finds work recovers expired leases too.
        self.claim_recovery_every_s = CLAIM_RECOVERY_EVERY_S
        #: How soon after a recovery a claim that finds nothing may skip its own.
        self.empty_claim_recovery_gap_s = EMPTY_CLAIM_RECOVERY_GAP_S
        #: Rows claims took and could not decode, each failed at once without running
        #: (`QuarantinedRow`); a counter for the metrics.
        self.undecodable_rows = 0
        #: Called once per such row, after it was failed (or found gone).
        self.on_undecodable: Callable[[QuarantinedRow], None] | None = None
        #: Where the database's clock is the host's wall clock (SQLite): the clock
        #: statements read, riding out its steps (`store/clockstep.py`).
        self.clock_watch: WallClockWatch | None = None

    # -- dialect primitives ------------------------------------------------------------

    @abstractmethod
    async def connect(self) -> None: ...

    async def close(self) -> None:
        """Let the operations under way finish, refuse new ones meanwhile, then close.
        Used again after this returns, the store opens again (store/admission.py).
        The close runs as a task of its own, shared by concurrent callers: every task
        scheduled before the call takes its first step (and is admitted) before it."""
        await self._closer.run(self._close_now)

    def sever(self) -> int:
        """Cut short the calls in flight on this store's connections (a stop that
        cannot wait for a silent database): how many. Each fails at once with a
        connection error, and its connection is not reused. A store whose calls
        cannot hang on a network does nothing."""
        return 0

    async def _close_now(self) -> None:
        self.barrier.refuse()
        try:
            await self._opener.settle()  # a connect in flight lands first
            await self._shut()
        finally:
            self.barrier.lift()

    @abstractmethod
    async def _shut(self) -> None:
        """Behind the closed barrier: let what was admitted finish, then release the
        connection or pool. The next use opens the store again."""

    @abstractmethod
    async def _fetch(
        self, op: str, params: Params, supplied: frozenset[str] = frozenset()
    ) -> list[Row]:
        """Run one statement outside any explicit transaction (a write may be
        group-committed with others by the dialect)."""

    @abstractmethod
    def _transaction(self) -> AbstractAsyncContextManager[Session]:
        """A write transaction; commits on clean exit, rolls back on error."""

    async def _scan(
        self,
        op: str,
        params: Params,
        supplied: frozenset[str],
        convert: Callable[[builtins.list[Row]], builtins.list[T]],
    ) -> builtins.list[T]:
        """A read whose cost grows with the table (`list`, `stats`), converted to
        values. Dialects override it to keep the event loop free while it runs."""
        return convert(await self._fetch(op, params, supplied))

    def _operation(self) -> AbstractContextManager[None]:
        """Bracket an operation of several statements, so that once it has begun a
        close lets it finish as a whole (store/admission.py)."""
        return Admission(self.barrier)

    @property
    def closing(self) -> bool:
        """True while `close()` drains: new operations are refused meanwhile."""
        return self.barrier.refusing

    async def _lock_key(self, session: Session, key: str) -> None:
        """Serialize keyed operations on `key` for the rest of the transaction.

        SQLite's write transaction is already exclusive, so only Postgres overrides it.
        """

    async def __aenter__(self) -> TaskStore:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _task(self, row: Row) -> Task:
        # Driver rows are fresh dicts that only this call reads: the task takes them.
        return Task.from_row(row, self.json_is_text, take=True)

    def _tasks(self, rows: Sequence[Row]) -> list[Task]:
        json_is_text = self.json_is_text
        return [Task.from_row(r, json_is_text, take=True) for r in rows]

    # -- hooks used by the client layer ------------------------------------------------

    def use_backpressure(
        self, max_queue_depth: int | Mapping[str, int], *, max_queue_wait_ms: int = 600_000
    ) -> None:
        from cairnqd.store.backpressure import QueueDepthGate

        self._gate = QueueDepthGate(self, max_queue_depth, max_queue_wait_ms=max_queue_wait_ms)

    def use_limits(self, limits: Sequence[Limit]) -> None:
        """Claim only tasks whose flow-control limits have room (docs/limits.md); an
        empty sequence goes back to the protocol's claim statements."""
        from cairnqd.store.limits import LimitedClaims

        self.limited = LimitedClaims(self.dialect, limits) if limits else None

    def limited_for(self, queues: Sequence[str]) -> LimitedClaims | None:
        """The flow-control limits a claim of `queues` keeps: None where no limit may
        cover their tasks, so such a claim is the unlimited one, statement and pace."""
        limited = self.limited
        return limited if limited is not None and limited.cover(queues) else None

    def room_wait_ms(self, now: float) -> int | None:
        """How long (ms, from monotonic `now`) until the last claim's limits may have
        room again; None when no limit held that claim back."""
        at = None if self.limited is None else self.limited.room_at
        return None if at is None else max(1, int((at - now) * 1000))

    def use_retention(self, sweeper: Sweeper) -> None:
        """Run `sweeper` for as long as the store is open (see `_opened`, `_closing`)."""
        self._retention = sweeper

    def _opened(self) -> None:
        """Each dialect calls this once its connection (or pool) is open."""
        if self._retention is not None:
            self._retention.start()

    async def _closing(self) -> None:
        """Each dialect awaits this first when it closes, while statements still run
        (a sweep in flight finishes, and may still start a VACUUM)."""
        if self._retention is not None:
            await self._retention.stop()

    async def applied_migrations(self) -> dict[str, builtins.list[tuple[str, int]]]:
        """Both ledgers, oldest first: {"cairnq_migrations": [(name, applied_at_ms)],
        "cairnqd_migrations": [...]}."""
        out: dict[str, builtins.list[tuple[str, int]]] = {}
        for table, op in (
            ("cairnq_migrations", "ledger_list"),
            ("cairnqd_migrations", "extensions/ledger_list"),
        ):
            rows = await self._fetch(op, {})
            out[table] = [(r["name"], int(r["applied_at_ms"])) for r in rows]
        return out

    async def server_connection_limits(self) -> tuple[int, int] | None:
        """(max_connections, superuser_reserved_connections) of a database server, or
        None when there is no server to share (SQLite). Needs no `connect()`."""
        return None

    async def protocol_version(self) -> int:
        rows = await self._fetch("protocol_version", {})
        return int(rows[0]["value"]) if rows else 0

    # -- submit ------------------------------------------------------------------------

    async def submit(
        self,
        *,
        name: str,
        payload: Any = None,
        queue: str = "default",
        key: str | None = None,
        conflict: str = "reuse",
        max_attempts: int = 3,
        priority: int = 0,
        metadata: Any = None,
        parent_id: str | None = None,
        root_id: str | None = None,
        correlation_id: str | None = None,
        delay_ms: int = 0,
        after: Sequence[Any] | None = None,
        tx: object = None,
    ) -> Task:
        """Queue one task. A bad argument raises ValueError (or SerializationError for
        a payload or metadata) naming it, before anything is written; the limits are
        Postgres's on both dialects (store/arguments.py lists them).

        `tx`: the caller's open transaction on this store's database (docs/transactions.md):
        the task is written through it and commits, or rolls back, with the caller's
        work; the store never commits, rolls back or closes it.

        `after`: tasks (or ids) that must all succeed before this one can be claimed
        (docs/workflows.md); a missing one raises ValueError naming it, and nothing
        is written."""
        parents = parent_ids(after) if after is not None else []
        params = submit_params(
            {
                "name": name,
                "payload": payload,
                "queue": queue,
                "key": key,
                "conflict": conflict,
                "max_attempts": max_attempts,
                "priority": priority,
                "metadata": metadata,
                "parent_id": parent_id,
                "root_id": root_id,
                "correlation_id": correlation_id,
                "delay_ms": delay_ms,
            }
        )
        with self._operation():
            if self._gate is not None:
                await self._gate.admit(queue)
            if parents:
                async with self._all_or_none(tx) as session:
                    return await self._submit_after(session, params, parents)
            if tx is not None:
                tx = await driver_connection(tx)
                if key is None:  # one statement, atomic by itself
                    session = await self._caller_session(tx)
                    return (await self._insert_run(session.fetch, [params]))[0]
                async with self._in_caller_tx(tx) as session:
                    return await self._submit_keyed(session, params)
            if key is None:
                return await self._insert_keyless(params)
            async with self._transaction() as session:
                return await self._submit_keyed(session, params)

    async def _submit_after(self, session: Session, params: Params, parents: list[str]) -> Task:
        """One submit that waits for `parents`, inside `session`. A keyed submit that
        hands back an existing task leaves that task's own dependencies as they are."""
        missing = await missing_parents(session, parents)
        if missing:
            raise missing_parent("after", missing[0])
        if params["key"] is None:
            task = (await self._insert_run(session.fetch, [params]))[0]
        else:
            task = await self._submit_keyed(session, params)
            if task.id != params["id"]:
                return task
        held = await hold(session, task.id, parents)
        return task if held is None else self._task(held)

    async def _submit_many_after(
        self, items: Sequence[Any], refs: list[list[ItemRef]], tx: object
    ) -> list[Task]:
        """`submit_many` of a list where some items wait for others (docs/workflows.md):
        every item inserted in list order, then each waiting one held, in list order, so
        an item's ancestors are written before its own. All or nothing."""
        prepared = prepare_items(without_after(items), new_task_ids(len(items)), 0, len(items))
        named = [ref for mine in refs for ref in mine if isinstance(ref, str)]
        with self._operation():
            if self._gate is not None:
                for params in prepared:
                    await self._gate.admit(params["queue"])

            async def write(session: Session) -> list[Task]:
                missing = set(await missing_parents(session, list(dict.fromkeys(named))))
                for index, mine in enumerate(refs):
                    for n, ref in enumerate(mine):
                        if isinstance(ref, str) and ref in missing:
                            raise missing_parent(f"tasks[{index}].after[{n}]", ref)
                tasks = await self._insert_prepared(session, prepared)
                for index, mine in enumerate(refs):
                    if not mine or tasks[index].id != prepared[index]["id"]:
                        continue
                    parents = list(
                        dict.fromkeys(tasks[r].id if isinstance(r, int) else r for r in mine)
                    )
                    held = await hold(session, tasks[index].id, parents)
                    if held is not None:
                        tasks[index] = self._task(held)
                return tasks

            async with self._all_or_none(tx) as session:
                return await write(session)

    async def dependencies(self, task_id: str) -> builtins.list[Task]:
        """The tasks `task_id` was submitted `after`, in the order named (a parent
        purged since is left out)."""
        require_str(task_id, "task_id")
        return self._tasks(await self._fetch("dependency_tasks", {"task_id": task_id}))

    async def waiting_counts(self) -> dict[str, int]:
        """Per queue, the tasks queued behind their dependencies (not yet due)."""
        rows = await self._fetch("dependency_waiting", {})
        return {row["queue"]: int(row["n"]) for row in rows}

    async def dependents(self, task_id: str, *, limit: int | None = None) -> builtins.list[Task]:
        """The tasks submitted `after` `task_id`, oldest first: all, or the first `limit`."""
        require_str(task_id, "task_id")
        if limit is not None:
            # Bounded as the column it binds to: past 64 bits the drivers raised their
            # own errors (OverflowError, "bigint out of range"), naming no argument.
            require_int(limit, "limit", minimum=0, maximum=INT8_MAX)
        params = {"task_id": task_id, "limit": limit}
        return self._tasks(await self._fetch("dependency_dependents", params))

    async def count_dependents(self, task_id: str) -> int:
        """How many tasks were submitted `after` `task_id`."""
        require_str(task_id, "task_id")
        rows = await self._fetch("dependency_dependents_count", {"task_id": task_id})
        return int(rows[0]["n"])

    async def graph(self, task_id: str, *, limit: int = GRAPH_LIMIT) -> TaskGraph:
        """The dependency graph `task_id` belongs to: its roots and every task that
        descends from them, at most `limit` (docs/workflows.md)."""
        require_str(task_id, "task_id")
        # One less than the largest bigint: the statement reads limit + 1 rows.
        require_int(limit, "limit", minimum=1, maximum=INT8_MAX - 1)
        nodes = await self._fetch("dependency_graph", {"task_id": task_id, "limit": limit + 1})
        ids = [row["id"] for row in nodes[:limit]]
        edges = await self._fetch("dependency_graph_edges", {"ids": ids}) if ids else []
        return TaskGraph.from_rows(nodes[:limit], edges, truncated=len(nodes) > limit)

    async def waiting(
        self,
        *,
        queue: str | None = None,
        name: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[builtins.list[Task], int]:
        """The tasks waiting on dependencies, newest first, and how many match."""
        require_str(queue, "queue", optional=True)
        require_str(name, "name", optional=True)
        check_page(limit, offset)
        rows = await self._fetch(
            "dependency_waiting_list",
            {"queue": queue, "name": name, "limit": limit, "offset": offset},
        )
        matched = int(rows[0]["matched"]) if rows else 0
        return self._tasks([{k: v for k, v in r.items() if k != "matched"} for r in rows]), matched

    async def _caller_session(self, tx: object) -> Session:
        """The caller's open transaction `tx` (a driver connection) as a session for
        one statement, atomic by itself, once it is found to be one this dialect can
        write through, on this store's database. TypeError for an object this dialect
        cannot use, ValueError for a closed or failed transaction or another database."""
        raise TypeError(f"{self.barrier.describe} cannot write through tx=")

    def _in_caller_tx(self, tx: object) -> AbstractAsyncContextManager[Session]:
        """`_caller_session` for statements that must land all or none: a savepoint in
        the caller's transaction, undone alone if they fail."""
        raise TypeError(f"{self.barrier.describe} cannot write through tx=")

    @asynccontextmanager
    async def _all_or_none(self, tx: object) -> AsyncIterator[Session]:
        """A session whose statements land together: a savepoint in the caller's open
        transaction `tx` (docs/transactions.md), or else a transaction of our own."""
        if tx is None:
            async with self._transaction() as session:
                yield session
            return
        async with self._in_caller_tx(await driver_connection(tx)) as session:
            yield session

    async def _insert_keyless(self, params: Params) -> Task:
        """One keyless submit. A dialect may queue it with concurrent ones (see
        store/coalesce.py); SQLite's group commit already shares its transaction."""
        return await self._insert_one(params)

    async def _insert_one(self, params: Params) -> Task:
        """A keyless submit alone: `insert_many` with one row, not `insert_task`, whose
        `returning *` sends the whole row back to be decoded (column descriptions, the
        JSON parsed again) for values the caller already holds. One at a time ran
        1.1-1.4x as fast on both dialects (bench/RESULTS.md, "How submits are written")."""
        return (await self._insert_many_keyless([params]))[0]

    async def _insert_many_keyless(self, prepared: Sequence[Params]) -> builtins.list[Task]:
        """Keyless submits in one statement, atomically."""
        return await self._insert_run(self._fetch, prepared)

    async def _insert_run(
        self,
        fetch: Callable[[str, Params], Awaitable[builtins.list[Row]]],
        run: Sequence[Params],
    ) -> builtins.list[Task]:
        """One `insert_many` of validated keyless submits, through `fetch` (the store's,
        or a transaction's). Only the times come back; the rest is what we inserted, so
        the rows are not parsed back out of their JSON."""
        rows = await fetch("insert_many", insert_many_params(run))
        return inserted_tasks(run, int(rows[0]["now_ms"]))

    async def submit_keyed_in(self, session: Session, params: Params) -> Task:
        """A keyed submit inside `session` (prepared `params`, a key among them), with
        the key's conflict rules: for a table class whose own write must commit with the
        task's (a schedule slot and the task it enqueues)."""
        return await self._submit_keyed(session, params)

    async def _submit_keyed(self, session: Session, params: Params) -> Task:
        key, conflict = params["key"], params["conflict"]
        await self._lock_key(session, key)
        key_rows = await session.fetch("get_key", {"key": key})
        if key_rows:
            current = await session.fetch("get", {"id": key_rows[0]["task_id"]})
            # A vanished task (purged, its key row about to cascade) frees the key.
            if current:
                existing = self._task(current[0])
                if conflict == "reject":
                    raise AlreadyExists(key)
                if existing.status in _REUSABLE[conflict]:
                    return existing
                if existing.status in _LIVE:
                    await session.fetch("cancel", {"id": existing.id})
        rows = await session.fetch("insert_task", params)
        await session.fetch("upsert_key", {"key": key, "task_id": params["id"]})
        return self._task(rows[0])

    async def submit_many(
        self, tasks: Sequence[Mapping[str, Any]], *, tx: object = None
    ) -> list[Task]:
        """Submit many tasks in one transaction; all or nothing.

        Each item takes `submit`'s keyword arguments. Keys and conflict strategies are
        honoured in list order, so two items with one key behave as two submits in a
        row. A bad item raises (naming its index) and nothing is written. `tx`: the
        caller's open transaction, as for `submit`.
        """
        items = tasks if isinstance(tasks, list | tuple) else list(tasks)
        refs = item_refs(items)
        if refs is not None:
            return await self._submit_many_after(items, refs, tx)
        prepared = prepare_items(items, new_task_ids(len(items)), 0, len(items))
        if not prepared:
            await asyncio.sleep(0)  # every operation yields, even one with nothing to do
            return []
        with self._operation():
            if self._gate is not None:
                for params in prepared:
                    await self._gate.admit(params["queue"])
            async with self._all_or_none(tx) as session:
                return await self._insert_prepared(session, prepared)

    async def _insert_prepared(self, session: Session, prepared: list[Params]) -> list[Task]:
        """Insert validated submits in list order inside `session`.

        Runs of keyless submits go in as one set-based `insert_many` per run; keyed
        ones take the keyed path one by one, so order-dependent conflicts (two items
        with one key) behave as consecutive submits.
        """
        out: list[Task] = []
        run: list[Params] = []

        async def flush_run() -> None:
            if run:
                out.extend(await self._insert_run(session.fetch, run))
                run.clear()

        for params in prepared:
            if params["key"] is None:
                run.append(params)
                if len(run) >= INSERT_MANY_CHUNK:
                    await flush_run()
            else:
                await flush_run()
                out.append(await self._submit_keyed(session, params))
        await flush_run()
        return out

    # -- reads -------------------------------------------------------------------------

    async def get(self, task_id: str) -> Task | None:
        require_str(task_id, "task_id")
        rows = await self._fetch("get", {"id": task_id})
        return self._task(rows[0]) if rows else None

    async def get_by_key(self, key: str) -> Task | None:
        require_str(key, "key")
        rows = await self._fetch("get_by_key", {"key": key})
        return self._task(rows[0]) if rows else None

    async def get_status(self, task_id: str) -> TaskRef | None:
        require_str(task_id, "task_id")
        rows = await self._fetch("get_status", {"id": task_id})
        return TaskRef.from_row(rows[0]) if rows else None

    async def get_status_by_key(self, key: str) -> TaskRef | None:
        require_str(key, "key")
        rows = await self._fetch("get_status_by_key", {"key": key})
        return TaskRef.from_row(rows[0]) if rows else None

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
        check_status_filter(status)
        # Checked as `get` and `stats` check theirs: unchecked, SQLite compared a NUL,
        # a number or a lone surrogate and found nothing, while Postgres's driver raised.
        for arg, value in (
            ("queue", queue),
            ("name", name),
            ("root_id", root_id),
            ("correlation_id", correlation_id),
        ):
            require_str(value, arg, optional=True)
        check_page(limit, offset)
        params: Params = {
            "status": status,
            "queue": queue,
            "name": name,
            "root_id": root_id,
            "correlation_id": correlation_id,
            "limit": limit,
            "offset": offset,
        }
        supplied = optional_filters(
            params, ("status", "queue", "name", "root_id", "correlation_id")
        )
        return await self._scan("list", params, supplied, self._tasks)

    async def stats(self, queue: str | None = None) -> dict[str, dict[str, int]]:
        require_str(queue, "queue", optional=True)
        params: Params = {"queue": queue}
        rows = await self._scan("stats", params, optional_filters(params, ("queue",)), _rows)
        out: dict[str, dict[str, int]] = {}
        if queue is not None:
            out[queue] = dict.fromkeys(STATUSES, 0)
        for row in rows:
            counts = out.setdefault(row["queue"], dict.fromkeys(STATUSES, 0))
            counts[row["status"]] = int(row["n"])
        return out

    async def queue_depth(self, queue: str, max_depth: int) -> int:
        require_str(queue, "queue")
        require_int(max_depth, "max_depth", minimum=0, maximum=INT8_MAX)
        rows = await self._fetch("queue_depth", {"queue": queue, "max_depth": max_depth})
        return int(rows[0]["headroom"])

    # -- control -----------------------------------------------------------------------

    async def cancel(self, task_id: str) -> Task | None:
        require_str(task_id, "task_id")
        rows = await self._fetch("cancel", {"id": task_id})
        return self._task(rows[0]) if rows else None

    async def retry(self, task_id: str, *, reset_attempt: bool = False) -> Task | None:
        require_str(task_id, "task_id")
        rows = await self._fetch("retry", {"id": task_id, "reset_attempt": bool(reset_attempt)})
        # Read again: a task whose parents have not all succeeded was put back to wait
        # by a trigger after the statement's row was returned (docs/workflows.md).
        return (await self.get(task_id) or self._task(rows[0])) if rows else None

    async def _by_key(self, key: str, op: str, params: Params) -> Task | None:
        require_str(key, "key")
        async with self._transaction() as session:
            await self._lock_key(session, key)
            key_rows = await session.fetch("get_key", {"key": key})
            if not key_rows:
                return None
            rows = await session.fetch(op, {**params, "id": key_rows[0]["task_id"]})
            if rows and op == "retry":  # as the dependency triggers left it (see retry)
                rows = await session.fetch("get", {"id": key_rows[0]["task_id"]}) or rows
            return self._task(rows[0]) if rows else None

    async def cancel_by_key(self, key: str) -> Task | None:
        return await self._by_key(key, "cancel", {})

    async def retry_by_key(self, key: str, *, reset_attempt: bool = False) -> Task | None:
        return await self._by_key(key, "retry", {"reset_attempt": bool(reset_attempt)})

    def _purge_params(
        self,
        older_than_ms: int,
        queue: str | None,
        status: str | None,
        name: str | None,
        limit: int,
    ) -> tuple[Params, frozenset[str]]:
        require_duration(older_than_ms, "older_than_ms")
        require_int(limit, "limit", minimum=1, maximum=INT8_MAX)
        check_terminal_status(status)
        # As `list`'s filters: the same error from both dialects, not [] from one.
        require_str(queue, "queue", optional=True)
        require_str(name, "name", optional=True)
        params: Params = {
            "older_than_ms": older_than_ms,
            "queue": queue,
            "status": status,
            "name": name,
            "limit": limit,
        }
        return params, optional_filters(params, ("queue", "status", "name"))

    async def purge(
        self,
        *,
        older_than_ms: int = 0,
        queue: str | None = None,
        status: str | None = None,
        name: str | None = None,
        limit: int = 1000,
    ) -> builtins.list[str]:
        params, supplied = self._purge_params(older_than_ms, queue, status, name, limit)
        return [r["id"] for r in await self._fetch("purge", params, supplied)]

    async def count_purgeable(
        self,
        *,
        older_than_ms: int = 0,
        queue: str | None = None,
        status: str | None = None,
        name: str | None = None,
    ) -> int:
        """How many rows `purge` with these filters would delete (all batches)."""
        params, supplied = self._purge_params(older_than_ms, queue, status, name, 1)
        rows = await self._scan("purge_count", params, supplied, _rows)
        return int(rows[0]["n"])

    async def after_purge(self, *, wait: bool = False) -> None:
        """Tidy up after a purge that deleted rows: SQLite checkpoints its WAL, Postgres
        vacuums when autovacuum is off. `wait`: return only when the tidy-up is done
        (a command that exits next); else a long one may go on in the background."""

    # -- tables above the protocol's (store/tables/) and leadership --------------------

    @functools.cached_property
    def executor(self) -> StoreExecutor:
        """This store's statements, for the table classes above it."""
        return StoreExecutor(self)

    @functools.cached_property
    def pauses(self) -> QueuePauses:
        """The operator's queue pauses."""
        return QueuePauses(self.executor)

    @functools.cached_property
    def attempts(self) -> AttemptHistory:
        """The record of every attempt of a task (docs/operations.md)."""
        return AttemptHistory(self.executor)

    @functools.cached_property
    def bulk(self) -> BulkActions:
        """Cancel and retry by filter, a page at a time."""
        return BulkActions(self.executor)

    @functools.cached_property
    def dashboard(self) -> DashboardReads:
        """The dashboard's reads and its discard of failed tasks."""
        return DashboardReads(self.executor)

    @functools.cached_property
    def reports(self) -> DaemonReports:
        """Each daemon's last report of its groups and children."""
        return DaemonReports(self.executor)

    @functools.cached_property
    def limit_table(self) -> LimitTable:
        """What the flow-control limits hold now, and the operator's overrides."""
        from cairnqd.store.tables.limits import LimitTable

        return LimitTable(self.executor)

    @functools.cached_property
    def queue_counts(self) -> QueueCounts:
        """Per-queue counters of finished tasks, written by workers, read by charts."""
        return QueueCounts(self.executor)

    @functools.cached_property
    def fleet(self) -> FleetRegistry:
        """The daemons on this database, their versions and the features they honour."""
        return FleetRegistry(self.executor)

    @functools.cached_property
    def leadership(self) -> Leadership:
        """Leadership among the hosts on this database (store/leadership.py): always
        held where one host reaches the database; dialects with many override it."""
        return SOLE_HOST

    # -- claiming ----------------------------------------------------------------------

    def _register_wakeable(self, queues: Sequence[str]) -> None:
        """Push-capable dialects start buffering wake-ups for these queues."""

    def _settling(self, task_ids: Sequence[str]) -> None:
        """A claim is about to settle these tasks: push-capable dialects know their
        `cairnq_done` notifications for their own, no sign of room elsewhere."""

    def wake_from_now(self) -> None:
        """The next `claim_wake` counts only what commits from now on. For a worker
        waiting for a limit's room: its own claim's commit is no sign of room."""

    async def claim(
        self,
        *,
        queues: Sequence[str],
        worker_id: str,
        lease_ms: int = 30_000,
        limit: int = 1,
        names: Sequence[str] | None = None,
    ) -> builtins.list[Task]:
        # Any integer (0 or less asks for nothing), up to the 64-bit LIMIT it binds to:
        # a NaN, a float or a larger number failed in the driver, differently per dialect.
        require_int(limit, "limit", maximum=INT8_MAX)
        plan = _SingleDraw(names, limit)
        claimed = await self.claim_session(
            queues=queues, worker_id=worker_id, lease_ms=lease_ms, names=names, plan=plan
        )
        return claimed if claimed is not None else []

    async def claim_session(
        self,
        *,
        queues: Sequence[str],
        worker_id: str,
        lease_ms: int = 30_000,
        names: Sequence[str] | None,
        plan: ClaimPlanFn,
        settle: Sequence[SettleItem] = (),
        on_settled: Callable[[dict[str, str]], None] | None = None,
    ) -> builtins.list[Task] | None:
        """One claim transaction: recover expired leases, then let `plan` draw.

        A read-only probe runs first, so an idle worker never takes the write lock
        (SQLite) or opens a transaction (Postgres). Returns None, without calling
        `plan`, when there is nothing to claim and no lease to recover. Recovery is
        not filtered by queue or name: a dead worker's task is every worker's job.

        `plan` returns the rows its draws took (in any order); they come back as
        tasks, decoded after COMMIT. On SQLite every process waits for the write lock
        while a transaction is open, so nothing that can wait for the commit runs
        inside it: decoding a 256-row claim is about a tenth of its transaction.

        cairnqd extension: `settle` carries results to write with `complete_many`'s
        rules in the same transaction, so a busy worker pays one commit per cycle for
        finishing the last batch and claiming the next. `on_settled` receives
        {task_id: status} after COMMIT (ids absent from it had lost their lease).
        """
        # A lone string is a sequence too: "default" claimed from queues d, e, f, ...
        if isinstance(queues, str):
            raise ValueError(f"queues must be a list of queue names, got {queues!r}")
        if isinstance(names, str):
            raise ValueError(f"names must be a list of task names or None, got {names!r}")
        queue_list = list(queues)
        if not queue_list:
            raise ValueError("queues must name at least one queue")
        for q in queue_list:
            require_str(q, "queues[]")
        require_str(worker_id, "worker_id")
        require_duration(lease_ms, "lease_ms", minimum=1)
        name_list = None if names is None else list(names)
        with self._operation():
            return await self._claim(
                queue_list, name_list, worker_id, lease_ms, plan, settle, on_settled
            )

    async def _claim(
        self,
        queues: builtins.list[str],
        names: builtins.list[str] | None,
        worker_id: str,
        lease_ms: int,
        plan: ClaimPlanFn,
        settle: Sequence[SettleItem],
        on_settled: Callable[[dict[str, str]], None] | None,
    ) -> builtins.list[Task] | None:
        self._register_wakeable(queues)
        # Taken on every claim, so a hint never outlives the wake-up that set it.
        pushed = self._take_push_hint(queues)
        if not settle and not pushed:
            probe = await self._fetch("claimable_probe", {"queues": queues, "names": names})
            if not probe or not probe[0]["has_work"]:
                return None
        if self.clock_watch is not None:
            self.clock_watch.at_least(lease_ms / 1000)
        base: Params = {"worker_id": worker_id, "lease_ms": lease_ms}
        # Encoded before the transaction opens (see claim_session on what waits for it).
        settle_params = complete_many_params(worker_id, settle) if settle else None
        limited = self.limited_for(queues)
        if settle and limited is not None:
            self._settling([item[0] for item in settle])
        marks = markers_made()
        # A row holding text the driver refuses to decode fails the fetch of every row
        # with it and rolls the transaction back; `_replayable` then runs it once more,
        # reading such text as markers, so that row alone is failed (`_quarantine`).
        flown = await self._claim_at_once(queues, base, plan, settle_params, limited)
        if flown is None:
            drawn, settled = await self._replayable(
                lambda session: self._claim_in(session, queues, base, plan, settle_params, limited)
            )
        else:
            drawn, settled, then = flown
            if then is not None:
                more, _ = await self._replayable(
                    lambda session: self._claim_in(session, queues, base, then, None, limited)
                )
                drawn = [*drawn, *more]
        if limited is not None:
            limited.committed()
        if on_settled is not None and settle:
            on_settled(settled)
        tasks, bad = self._claimed(drawn, scan=markers_made() != marks)
        if bad:
            await self._quarantine(worker_id, bad)
        return tasks

    async def _claim_at_once(
        self,
        queues: builtins.list[str],
        base: Params,
        plan: ClaimPlanFn,
        settle_params: Params | None,
        limited: LimitedClaims | None,
    ) -> tuple[Sequence[Row], dict[str, str], ClaimPlanFn | None] | None:
        """The claim sent in one flight, when the dialect can and nothing in it waits on
        what an earlier statement returns: one draw, at most one flow-control budget
        (`LimitedClaims.flight`), recovery not due. The rows claimed, the settled
        statuses, and a plan to draw with in a transaction of its own afterwards, or
        None. None for the whole when the claim cannot go that way."""
        if self._recovery_due():
            return None
        single = one_draw_of(plan)
        if single is None:
            return None
        room = None
        if limited is not None:
            room = limited.flight(queues, single.names, single.limit, base)
            if room is None:
                return None
        flown = await self._claim_flight(queues, base, single, settle_params, room)
        if flown is None:
            return None
        rows, settled = flown
        if limited is not None and room is not None:
            rows, full = limited.landed(room, rows)
            if full:  # its stale room is due to be looked for, as a draw in its transaction would
                return rows, settled, _SingleDraw(single.names, single.limit - len(rows))
            if limited.room_at is not None:
                return rows, settled, None  # full: recovery keeps the pace of reclaims
        if rows or self._recovered_within(self.empty_claim_recovery_gap_s):
            return rows, settled, None
        # Found nothing: expired leases may be all the work there is (`_claim_in`'s
        # draw says why). Recover; only if that queued a task, draw again.
        if await self._recover_in(self._fetch):  # a statement of its own
            if limited is not None:
                limited.recovered()
            return rows, settled, plan
        return rows, settled, None

    async def _claim_flight(
        self,
        queues: builtins.list[str],
        base: Params,
        single: OneDraw,
        settle_params: Params | None,
        room: RoomFlight | None,
    ) -> tuple[builtins.list[Row], dict[str, str]] | None:
        """Write `settle_params`' results (`complete_many`, and with `room`, give their
        room back) and make `single`'s draw (`room`'s, when limited) in one transaction
        sent whole, without waiting on each statement's answer: the draw's rows and the
        settled statuses. None: this dialect sends statements one at a time (the
        default; Postgres overrides it)."""
        return None

    def _recovery_due(self) -> bool:
        return not self._recovered_within(self.claim_recovery_every_s)

    def _recovered_within(self, seconds: float) -> bool:
        return time.monotonic() - self._claim_recovered_at < seconds

    async def _claim_in(
        self,
        session: Session,
        queues: builtins.list[str],
        base: Params,
        plan: ClaimPlanFn,
        settle_params: Params | None,
        limited: LimitedClaims | None,
    ) -> tuple[Sequence[Row], dict[str, str]]:
        """The claim's transaction: settle, recover when due, draw. Its rows, not yet
        decoded, and the settled statuses. `limited`: the limits that may cover these
        queues (`limited_for`), or None."""
        settled: dict[str, str] = {}
        if settle_params is not None:
            rows = await session.fetch("complete_many", settle_params)
            settled = {r["id"]: r["status"] for r in rows}
            if limited is not None and not limited.counts_running:
                # Their room is back for the draw below, without waiting for a reclaim.
                await session.fetch("extensions/limit_slots_release", settle_params)
        recovered = False
        if self._recovery_due():
            if await self._recover_in(session.fetch) and limited is not None:
                limited.recovered()
            recovered = True

        async def take(names: Sequence[str] | None, limit: int, ready: int) -> list[Row]:
            if limited is not None:
                return await limited.draw(session, queues, names, limit, base, ready)
            op, params = claim_variant(queues, names)
            return await session.fetch(op, {**base, **params, "limit": limit})

        async def draw(
            names: Sequence[str] | None, limit: int, ready: int | None = None
        ) -> list[Row]:
            nonlocal recovered
            if limit <= 0 or (names is not None and len(names) == 0):
                return []
            ready = limit if ready is None else ready
            rows = await take(names, limit, ready)
            if limited is not None:
                # Recovery also gives back the room of expired tasks (`recovered`).
                # Short because a limit has no room is mostly not short of work: it then
                # runs at the pace the limit's stale room is looked for, not each time.
                short = len(rows) < limit
                if short and limited.room_at is not None:
                    short = not self._recovered_within(RECLAIM_EVERY_S)
            else:
                # Short but not empty, the worker keeps up with what arrives (a steady
                # stream claims a few tasks a cycle): recovery keeps its once-a-second
                # pace (above) rather than adding a statement to every claim on the way
                # to the handler. Empty, expired leases may be all the work there is
                # (what the probe saw, or what a claim without one must look for: a
                # notification may announce a task the claim before already took).
                short = not rows
            if short and not recovered:
                # Short of work: tasks with expired leases may be what is missing.
                recovered = True
                if await self._recover_in(session.fetch):
                    if limited is not None:
                        limited.recovered()  # their slots are stale now: look at once
                    more = await take(names, limit - len(rows), max(0, ready - len(rows)))
                    rows = [*rows, *more]
            return rows

        return await plan(draw), settled

    def _claimed(
        self, rows: Sequence[Row], *, scan: bool
    ) -> tuple[builtins.list[Task], builtins.list[tuple[Row, UndecodableRow]]]:
        """The claimed rows as tasks, each decoded on its own, and the rows that could
        not be, with why. `scan`: the driver made markers during the claim (a value it
        could not decode), so every value of every row is looked at first."""
        json_is_text = self.json_is_text
        from_row = Task.from_row
        tasks: builtins.list[Task] = []
        append = tasks.append
        bad: builtins.list[tuple[Row, UndecodableRow]] = []
        if scan:
            for row in rows:
                problem = undecodable_column(row)
                if problem is None:
                    try:
                        append(from_row(row, json_is_text, take=True, strict=True))
                        continue
                    except UndecodableRow as exc:
                        problem = exc
                bad.append((row, problem))
            return tasks, bad
        left = rows
        while True:
            # One try around the loop, not one per row: nothing to pay until a row fails.
            try:
                for row in left:
                    append(from_row(row, json_is_text, take=True, strict=True))
                return tasks, bad
            except UndecodableRow as exc:
                failed = len(tasks) + len(bad)
                bad.append((rows[failed], exc))
                left = rows[failed + 1 :]

    async def _quarantine(self, worker_id: str, bad: Sequence[tuple[Row, UndecodableRow]]) -> None:
        """Fail each claimed row that cannot be decoded, at once, without running it:
        status `failed` (`canceled` when a cancel was pending), the UndecodableRow
        envelope, never retried. Owned by this claim (worker and attempt), in one
        transaction; logged and counted once per row."""
        outcomes: builtins.list[tuple[Row, UndecodableRow, bool]] = []
        async with self._replay_transaction() as session:
            for row, problem in bad:
                params = {
                    "id": self._row_key(row.get("id")),
                    "worker_id": worker_id,
                    "attempt": _int_or_none(row.get("attempt")),
                    "error": _envelope_json(problem),
                }
                rows = await session.fetch("extensions/fail_undecodable", params)
                outcomes.append((row, problem, bool(rows)))
        for row, problem, failed in outcomes:
            self.undecodable_rows += 1
            quarantined = QuarantinedRow(
                id=str(row.get("id")),
                queue=str(row.get("queue")),
                name=str(row.get("name")),
                attempt=_int_or_none(row.get("attempt")),
                error=problem,
                failed=failed,
            )
            log.warning(
                "task %s (%s on queue %s) %s: %s",
                quarantined.id,
                quarantined.name,
                quarantined.queue,
                "failed without running" if failed else "could not be failed (lease gone)",
                problem,
            )
            if self.on_undecodable is not None:
                self.on_undecodable(quarantined)

    def _row_key(self, task_id: Any) -> Any:
        """How a statement binds the id a claimed row holds (SQLite: an id that is not
        UTF-8 as its raw bytes)."""
        return task_id

    def _replay_transaction(self) -> AbstractAsyncContextManager[Session]:
        """A write transaction whose fetches read text the driver cannot decode as
        markers instead of failing (SQLite). Elsewhere the driver never fails that way:
        the plain transaction."""
        return self._transaction()

    def _is_undecodable_text(self, exc: BaseException) -> bool:
        """Whether `exc` is the driver refusing to decode a stored text value, which
        `_replay_transaction` reads instead."""
        return False

    async def database_now_ms(self) -> int:
        """Now, by the clock the database's statements read (leases, `run_at_ms`): the
        server's on Postgres, the host's wall clock on SQLite, or the injected one."""
        return self.now_ms()

    async def _recover_in(
        self, fetch: Callable[[str, Params], Awaitable[builtins.list[Row]]]
    ) -> bool:
        """Recover expired leases for a claim, through `fetch` (its transaction's, or
        the store's own); whether any task went back to the queue."""
        self._claim_recovered_at = time.monotonic()
        rows = await fetch("recover_leases", {"error": LEASE_EXPIRED_ERROR_JSON})
        return any(r["status"] == "queued" for r in rows)

    async def recover_leases(self) -> builtins.list[Row]:
        """Recover every expired lease now (the daemon's reaper; claims do it too)."""

        async def recover(session: Session) -> builtins.list[Row]:
            return await session.fetch("recover_leases", {"error": LEASE_EXPIRED_ERROR_JSON})

        return await self._replayable(recover)

    async def _replayable(self, work: Callable[[Session], Awaitable[T]]) -> T:
        """`work` in a write transaction; run once more in `_replay_transaction` when a
        row it reads back holds text the driver refuses (its rows then hold markers)."""
        try:
            async with self._transaction() as session:
                return await work(session)
        except Exception as exc:
            if not self._is_undecodable_text(exc):
                raise
        async with self._replay_transaction() as session:
            return await work(session)

    async def release_worker(
        self,
        worker_id: str,
        *,
        message: str,
        unstarted: Sequence[tuple[str, int]] = (),
        interrupted: Sequence[tuple[str, int]] = (),
        interruption_cap: int = 0,
        why: str = "worker_exit",
    ) -> builtins.list[Row]:
        """Hand back every task `worker_id` still runs, with recovery's outcomes now:
        cancel requested -> canceled; attempts left -> queued; else failed with the
        lease-expired envelope carrying `message`. For a worker known to be dead (the
        daemon calls it after reaping the process), never for a live one.

        `unstarted` lists (task id, attempt) pairs the worker held without ever calling
        their handler: those are queued again with the attempt their claim spent given
        back (a pending cancel still wins). Anything not listed counts as started.

        `interrupted` lists the started tasks the operator cut short (a roll or a stop
        past `shutdown_timeout`, QUIT): each gets its attempt back as an unstarted one
        does, at most `interruption_cap` times per task over its life (counted in
        `cairnqd_interruptions`); past that it is handed back like any other.
        `why` the worker stopped names the attempts it closed in their history
        (worker_exit, shutdown, max_run, stall: `HAND_BACK_OUTCOMES`); an interrupted
        attempt whose attempt is given back reads `handed_back (operator)`.
        Returns the rows changed: id, queue, name, new status and attempt; a row whose
        attempt was given back for an interruption also has `interrupted` true."""
        require_str(worker_id, "worker_id")
        if why not in HAND_BACK_OUTCOMES:
            raise ValueError(f"why: expected one of {sorted(HAND_BACK_OUTCOMES)}, got {why!r}")
        error = dump_json(dataclasses.replace(LEASE_EXPIRED, message=message).to_dict())
        # One entry per task: Postgres' upsert refuses to touch a row twice.
        cut = {task_id: attempt for task_id, attempt in interrupted}
        cut_items = dump_json([{"id": task_id, "a": attempt} for task_id, attempt in cut.items()])

        async def release(session: Session) -> builtins.list[Row]:
            spared = list(unstarted)
            given: set[str] = set()
            if cut and interruption_cap > 0:
                await session.fetch("extensions/interruption_prune", {})
                allowed = await session.fetch(
                    "extensions/interruption_give",
                    {"worker_id": worker_id, "interrupted": cut_items, "cap": interruption_cap},
                )
                given = {str(r["task_id"]) for r in allowed}
                kept = [(task_id, cut[task_id]) for task_id in given]
                spared += kept
                await close_interrupted(session, worker_id, kept)
            returned: builtins.list[Row] = []
            if spared:
                items = dump_json([{"id": task_id, "a": attempt} for task_id, attempt in spared])
                returned = await session.fetch(
                    "extensions/return_unstarted", {"worker_id": worker_id, "unstarted": items}
                )
                returned = [
                    {**row, "interrupted": True} if row["id"] in given else row for row in returned
                ]
            released = await session.fetch(
                "release_worker", {"worker_id": worker_id, "error": error}
            )
            await name_hand_back(session, worker_id, released, why)
            return returned + released

        return await self._replayable(release)

    async def oldest_queued_age_ms(self) -> dict[str, int]:
        """Per queue: how long the oldest claimable queued task has been due."""
        rows = await self._scan("oldest_queued", {}, frozenset(), _rows)
        return {r["queue"]: _age_ms(r["age_ms"]) for r in rows}

    async def recent_counts(self, since_ms: int) -> dict[str, dict[str, int]]:
        """Per queue, tasks submitted (`submitted`) and ended (`succeeded`, `failed`,
        `canceled`) from epoch ms `since_ms` on, each read from an index range of the
        window's rows: real counts whatever a purge deletes meanwhile."""
        require_int(since_ms, "since_ms", minimum=0, maximum=INT8_MAX)
        counts: dict[str, dict[str, int]] = {}
        submitted = await self._scan(
            "extensions/recent_submitted", {"from_id": task_id_floor(since_ms)}, frozenset(), _rows
        )
        for r in submitted:
            counts.setdefault(r["queue"], {})["submitted"] = int(r["n"])
        ended = await self._scan(
            "extensions/recent_finished", {"since_ms": since_ms}, frozenset(), _rows
        )
        for r in ended:
            counts.setdefault(r["queue"], {})[r["status"]] = int(r["n"])
        return counts

    async def expired_leases(self) -> dict[str, int]:
        """Per queue: running tasks whose lease expired and await recovery."""
        rows = await self._scan("leases_expired", {}, frozenset(), _rows)
        return {r["queue"]: int(r["n"]) for r in rows}

    # -- owned writes ------------------------------------------------------------------

    async def _owned(
        self, op: str, task_id: str, params: Params, attempt: int | None = None
    ) -> Task:
        """One owned write of `task_id`; with `attempt`, only while the row is still at
        that attempt (a write that reached the row late, after the same worker claimed
        the task again, raises LostLease instead of settling the later attempt)."""
        _check_owner(task_id, params["worker_id"])
        params, supplied = for_attempt({**params, "id": task_id}, attempt)
        rows = await self._fetch(op, params, supplied)
        if not rows:
            raise LostLease(task_id)
        return self._task(rows[0])

    async def _settle_owned(
        self, op: str, task_id: str, params: Params, attempt: int | None = None
    ) -> Task:
        """`_owned` for a statement that ends the claim (complete, succeed, fail): with
        limits kept in slots, the claim's concurrency room is given back in the same
        transaction (SQLite counts running tasks instead: nothing to give back)."""
        if self.limited is None or self.limited.counts_running:
            return await self._owned(op, task_id, params, attempt)
        _check_owner(task_id, params["worker_id"])
        params, supplied = for_attempt({**params, "id": task_id}, attempt)
        async with self._transaction() as session:
            rows = await session.fetch(op, params, supplied)
            if not rows:
                raise LostLease(task_id)
            items = dump_json([{"id": task_id, "a": rows[0]["attempt"]}], check=False)
            release = {"worker_id": params["worker_id"], "items": items}
            await session.fetch("extensions/limit_slots_release", release)
        return self._task(rows[0])

    async def heartbeat(self, *, task_id: str, worker_id: str, lease_ms: int = 30_000) -> Task:
        # As a claim checks its lease: unchecked, a NaN or a 64-bit overflow failed in
        # the driver (differently per dialect) and 0 or less wrote a lease already over.
        require_duration(lease_ms, "lease_ms", minimum=1)
        return await self._owned(
            "heartbeat", task_id, {"worker_id": worker_id, "lease_ms": lease_ms}
        )

    async def heartbeat_batch(
        self, *, task_ids: Sequence[str], worker_id: str, lease_ms: int = 30_000
    ) -> dict[str, bool]:
        require_duration(lease_ms, "lease_ms", minimum=1)  # as `heartbeat`
        ids = _owned_ids(task_ids, worker_id)
        if not ids:
            await asyncio.sleep(0)  # every operation yields, even one with nothing to do
            return {}
        rows = await self._fetch(
            "heartbeat_batch", {"ids": ids, "worker_id": worker_id, "lease_ms": lease_ms}
        )
        return {r["id"]: r["cancel_requested_at_ms"] is not None for r in rows}

    async def renew_leases(
        self, *, held: Sequence[tuple[str, int]], worker_id: str, lease_ms: int = 30_000
    ) -> dict[str, tuple[int, bool]]:
        """The worker's heartbeat (cairnqd extension `renew_leases`): renew each
        (task id, attempt) in `held` that `worker_id` still owns under that attempt;
        {task id: (attempt, cancel requested)} for the rows renewed. Unlike
        `heartbeat_batch`, a renewal that reaches its row late neither renews a later
        attempt the same worker claimed since nor moves a lease earlier."""
        require_duration(lease_ms, "lease_ms", minimum=1)
        ids = _owned_ids([task_id for task_id, _ in held], worker_id)
        for index, (_, attempt) in enumerate(held):
            require_int(attempt, f"held[{index}] attempt", minimum=1)
        if not ids:
            await asyncio.sleep(0)
            return {}
        items = [{"id": task_id, "a": attempt} for task_id, attempt in held]
        rows = await self._fetch(
            "extensions/renew_leases",
            {"items": dump_json(items, check=False), "worker_id": worker_id, "lease_ms": lease_ms},
        )
        return {r["id"]: (int(r["attempt"]), r["cancel_requested_at_ms"] is not None) for r in rows}

    async def cancel_requests(self, *, task_ids: Sequence[str], worker_id: str) -> dict[str, int]:
        """Of `task_ids`, those `worker_id` runs whose cancel was requested: {task id:
        attempt}. A read by primary key, for a worker that watches its running handlers
        (`_cancels`); an empty list reads nothing."""
        ids = _owned_ids(task_ids, worker_id)
        if not ids:
            await asyncio.sleep(0)
            return {}
        rows = await self._fetch("extensions/cancel_flags", {"ids": ids, "worker_id": worker_id})
        return {r["id"]: int(r["attempt"]) for r in rows}

    async def progress(
        self,
        *,
        task_id: str,
        worker_id: str,
        progress: float | None,
        message: str | None,
        attempt: int | None = None,
    ) -> Task:
        if progress is not None:
            # A fraction, as `ctx.progress` takes it (docs/protocol.md §2.1): 5 showed
            # as 500% done, and an int past a float's range raised OverflowError.
            require_number(progress, "progress", minimum=0, maximum=1)
        _check_message(message)
        return await self._owned(
            "progress",
            task_id,
            {
                "worker_id": worker_id,
                "progress": None if progress is None else float(progress),
                "message": message,
            },
            attempt,
        )

    async def complete(
        self, *, task_id: str, worker_id: str, result: Any, attempt: int | None = None
    ) -> Task:
        encoded = None if result is None else dump_json(result, what="result")
        return await self._settle_owned(
            "complete", task_id, {"worker_id": worker_id, "result": encoded}, attempt
        )

    async def succeed(
        self,
        *,
        task_id: str,
        worker_id: str,
        result: Any,
        message: str | None = None,
        attempt: int | None = None,
    ) -> Task:
        _check_message(message)
        encoded = None if result is None else dump_json(result, what="result")
        params = {"worker_id": worker_id, "result": encoded, "message": message}
        return await self._settle_owned("succeed", task_id, params, attempt)

    async def fail(
        self,
        *,
        task_id: str,
        worker_id: str,
        error: Mapping[str, Any] | ErrorEnvelope,
        retryable: bool = True,
        delay_ms: int = 0,
        attempt: int | None = None,
    ) -> Task:
        require_duration(delay_ms, "delay_ms")
        return await self._settle_owned(
            "fail",
            task_id,
            {
                "worker_id": worker_id,
                "error": encode_error(error),
                "retryable": bool(retryable),
                "delay_ms": delay_ms,
            },
            attempt,
        )

    async def complete_many(self, *, worker_id: str, items: Sequence[SettleItem]) -> dict[str, str]:
        """Complete many owned tasks in one statement, each with `complete`'s rules.

        `items` pairs a task id with its result already encoded as JSON text by
        `dump_json` (None stores SQL NULL); the text is not checked again here.
        Returns {task_id: new status} for the rows settled; an id missing from it had
        lost its lease.
        """
        if not items:
            await asyncio.sleep(0)  # every operation yields, even one with nothing to do
            return {}
        params = complete_many_params(worker_id, items)
        if self.limited is None or self.limited.counts_running:
            rows = await self._fetch("complete_many", params)
        else:
            async with self._transaction() as session:
                rows = await session.fetch("complete_many", params)
                # Their room is back at once, not at the next claim that finds it full.
                await session.fetch("extensions/limit_slots_release", params)
        return {r["id"]: r["status"] for r in rows}

    async def complete_in(
        self, *, task_id: str, worker_id: str, write: UserWrite, attempt: int | None = None
    ) -> tuple[Task, Any]:
        raise UnsupportedBackend(
            f"complete_in needs a Postgres store; {type(self).__name__} cannot run the "
            "caller's writes and the settlement in one transaction"
        )

    # -- wake-ups (polling by default; Postgres overrides with LISTEN) -----------------

    async def claim_wake(self, queues: Sequence[str], timeout_ms: int) -> None:
        await _sleep_ms(timeout_ms)

    def _take_push_hint(self, queues: Sequence[str]) -> bool:
        """True (once) when a notification that work was queued in `queues` came since
        the last claim began (the last `claim_wake` ended on one, or a claim follows
        another under a stream), so this claim may skip its read-only probe."""
        return False

    async def task_done_wake(self, task_id: str, timeout_ms: int) -> None:
        await _sleep_ms(timeout_ms)

    # -- our own tables' DDL ------------------------------------------------------------

    @abstractmethod
    async def ensure_schema(self, name: str) -> None:
        """Create what `extensions/on_demand/<dialect>/<name>.sql` describes, if it is
        missing (the dashboard's indexes: `dashboard_indexes`). It may take a while on a
        large table; the dialect builds without blocking the workers' writes for long."""


def _check_owner(task_id: Any, worker_id: Any) -> None:
    """An owned write's ids: text both dialects compare. A NUL or a lone surrogate
    answered LostLease on SQLite and a driver error on Postgres."""
    require_str(task_id, "task_id")
    require_str(worker_id, "worker_id")


def _owned_ids(task_ids: Sequence[str], worker_id: Any) -> builtins.list[str]:
    """`task_ids` of a batch of owned reads or writes, each checked as `_check_owner`
    checks one (a string would be a list of one-letter ids)."""
    if isinstance(task_ids, str):
        raise ValueError(f"task_ids must be a list of task ids, got {task_ids!r}")
    ids = list(task_ids)
    for index, task_id in enumerate(ids):
        require_str(task_id, f"task_ids[{index}]")
    require_str(worker_id, "worker_id")
    return ids


def _check_message(message: Any) -> None:
    if message is None:
        return
    if not isinstance(message, str):
        raise ValueError(f"message must be a string or None, got {type(message).__name__}")
    check_text(message, "message")


def _rows(rows: list[Row]) -> list[Row]:
    return rows


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _envelope_json(problem: UndecodableRow) -> str:
    envelope = problem.envelope().to_dict()
    try:
        return dump_json(envelope, what="error")
    except SerializationError:
        # The text shown could not be stored (a NUL): the envelope without it.
        envelope["details"] = {k: v for k, v in envelope["details"].items() if k != "raw"}
        return dump_json(envelope, what="error")


@asynccontextmanager
async def _always_held() -> AsyncIterator[bool]:
    yield True


async def _sleep_ms(ms: int) -> None:
    await asyncio.sleep(max(0, ms) / 1000)


__all__ = [
    "LEASE_EXPIRED",
    "ClaimDraw",
    "ClaimPlanFn",
    "Clock",
    "Params",
    "QuarantinedRow",
    "Row",
    "Session",
    "TaskStore",
]


def _age_ms(value: Any) -> int:
    """An age the database computed, as whole ms from 0 to INT8_MAX. A due time another
    client wrote far in the past makes it huge (Postgres: numeric), or infinite (SQLite
    keeps -Infinity in the integer column): as old as it gets, not an OverflowError for
    every reader (metrics, the dashboard, `cairnqd top`)."""
    if isinstance(value, float) and not math.isfinite(value):
        return INT8_MAX if value > 0 else 0
    return min(INT8_MAX, max(0, int(value)))
