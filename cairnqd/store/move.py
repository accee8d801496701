"""Moving a SQLite database to Postgres (`cairnqd move-to`, docs/operations.md,
"Moving from SQLite to Postgres").

`TABLES` is the one list of what a move copies, in order, and `SKIPPED` of the tables
it leaves behind and why; a table of the SQLite schema in neither fails a test, so a
new table cannot be forgotten. Each table moves in batches in primary-key order, one
target transaction per batch that also advances the table's row in `cairnqd_moves`:
a move cut off anywhere carries on where its last batch committed, and never writes a
row twice. Tasks running at the source arrive as the lease reaper would leave them
(`settle_running`, the protocol's own statement), so nothing arrives running.

The verification reads every batch again on both sides, the target's by key, and
compares a SHA-256 of each batch's rows written out the same way, then the task counts
per queue and status and the row count of every table.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cairnqd.errors import CairnQError, ProtocolVersionMismatch
from cairnqd.store.migrate import STORAGE_PROTOCOL_VERSION, check_protocol_version
from cairnqd.store.sqlite.movesource import SqliteMoveSource, settle_running
from cairnqd.store.statement_params import LEASE_EXPIRED_ERROR_JSON
from cairnqd.store.tables.fleet import LIVE_MS

if TYPE_CHECKING:  # psycopg loads only once a move starts: SQLite commands never load it
    from cairnqd.store.postgres.movetarget import PostgresMoveTarget, Progress

Row = tuple[Any, ...]

#: Rows per batch, and per target transaction.
DEFAULT_BATCH = 5_000


@dataclass(frozen=True)
class Table:
    """A table a move copies, and what it holds."""

    name: str
    what: str


#: What a move copies, in this order (keys after their tasks: the foreign key).
TABLES: tuple[Table, ...] = (
    Table(
        "cairnq_tasks", "the tasks, every column as is; running ones as lease recovery leaves them"
    ),
    Table("cairnq_task_keys", "idempotency keys"),
    Table("cairnqd_attempts", "the attempt history; a running task's open attempt closed as lost"),
    Table("cairnqd_interruptions", "attempts given back after an operator's stop"),
    Table("cairnqd_queue_pauses", "paused queues"),
    Table("cairnqd_schedules", "each schedule's last slot, misfires and last error"),
    Table("cairnqd_limit_slots", "flow-control slots and rate windows"),
    Table("cairnqd_limit_overrides", "limits set with `cairnqd limits set`"),
    Table("cairnqd_limit_bypasses", "bypassed limits noted for the operator"),
    Table("cairnqd_queue_counts", "the per-queue counters behind the dashboard's charts"),
    Table("cairnqd_task_deps", "task dependencies: each task's parents, in the order named"),
    Table("cairnqd_task_ancestors", "every ancestor of each task submitted after others"),
    Table("cairnqd_task_waits", "tasks waiting for their parents, or canceled by an ancestor"),
)

#: Tables of the SQLite schema a move leaves behind, and why.
SKIPPED: dict[str, str] = {
    "cairnq_meta": "protocol and schema version: the target's migrations write its own",
    "cairnq_migrations": "the protocol's migration ledger: the target's migrations write its own",
    "cairnqd_migrations": "cairnqd's migration ledger: the target's migrations write its own",
    "cairnqd_features": "written by the target's migrations",
    "cairnqd_fleet": "daemons registered on the SQLite file, which never connected to the "
    "target; the target's daemons register themselves when they start",
    "cairnqd_daemons": "dashboard reports of daemons on the SQLite file, rewritten by the "
    "target's daemons every refresh",
    "cairnqd_limit_workers": "the SQLite workers that count a limit's running tasks; on "
    "Postgres a claim takes a slot instead (cairnqd_limit_slots)",
    "cairnqd_task_dep_moves": "empty outside a statement: the SQLite triggers' hand-off of a "
    "task's status move to the dependency triggers (Postgres has no such table)",
}


class MoveError(CairnQError):
    """A move that cannot start or carry on; the message says why and what to do."""


@dataclass
class Plan:
    """What the source holds and what the target already has."""

    source: str
    target: str
    counts: dict[str, int]
    running: int
    target_tasks: int
    resuming: bool
    target_version: int | None


@dataclass
class TableResult:
    name: str
    source_rows: int
    moved: int
    skipped: int


@dataclass
class Verdict:
    tables: list[TableResult]
    differences: list[str] = field(default_factory=list)
    settled: int = 0

    @property
    def ok(self) -> bool:
        return not self.differences

    def line(self) -> str:
        tasks = next((t for t in self.tables if t.name == "cairnq_tasks"), None)
        moved = tasks.moved if tasks else 0
        skipped = tasks.skipped if tasks else 0
        others = sum(t.moved for t in self.tables if t.name != "cairnq_tasks")
        text = f"moved {moved} tasks and {others} other rows"
        if skipped:
            text += f" ({skipped} tasks already on the target kept as they were)"
        if self.settled:
            text += f", {self.settled} running at the source settled as lease recovery would"
        if self.ok:
            return text + ": verified"
        return text + f": NOT verified, {len(self.differences)} differences"


#: (table, rows done, rows of the table): once before a table's first batch (what
#: earlier runs did), after each batch, and at its end.
ProgressFn = Callable[[str, int, int], None]


def _now_ms() -> int:
    return int(time.time() * 1000)


class Move:
    """One move of the SQLite file at `source_path` into the Postgres `dsn`."""

    def __init__(
        self,
        source_path: str,
        dsn: str,
        *,
        batch: int = DEFAULT_BATCH,
        merge: bool = False,
        connect_timeout_s: float = 10.0,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch size {batch}: must be at least 1")
        self.batch = batch
        self.merge = merge
        from cairnqd.store.postgres.movetarget import PostgresMoveTarget

        self.source = SqliteMoveSource(source_path)
        try:
            self.target: PostgresMoveTarget = PostgresMoveTarget(
                dsn, connect_timeout_s=connect_timeout_s
            )
        except BaseException:
            self.source.close()
            raise
        self._settled_tasks: dict[Row, Row] = {}
        self._settled_attempts: dict[Row, Row] = {}
        self._key_at: dict[str, list[int]] = {}

    def close(self) -> None:
        self.source.close()
        self.target.close()

    # -- before anything is written ----------------------------------------------------

    def plan(self) -> Plan:
        """Check both sides and count what would move; writes nothing."""
        version, pending = self.source.check()
        check_protocol_version(version, self.source.path)
        if pending:
            raise MoveError(
                f"{self.source.path}: {len(pending)} migrations pending "
                f"({', '.join(pending[:3])}{'...' if len(pending) > 3 else ''}); "
                "run `cairnqd migrate` on it first, with this cairnqd"
            )
        target_version = self.target.protocol_version()
        if target_version is not None and target_version != STORAGE_PROTOCOL_VERSION:
            raise ProtocolVersionMismatch(
                f"{self.target.where}: storage protocol_version={target_version}, "
                f"cairnqd supports {STORAGE_PROTOCOL_VERSION}; nothing was written"
            )
        present = set(self.source.tables())
        counts = {t.name: self.source.count(t.name) for t in TABLES if t.name in present}
        running = self.source.group_counts()
        return Plan(
            source=self.source.path,
            target=self.target.where,
            counts=counts,
            running=sum(n for (_, status), n in running.items() if status == "running"),
            target_tasks=self.target.count("cairnq_tasks"),
            resuming=bool(self.target.progress(self.source.path)),
            target_version=target_version,
        )

    def live_daemons(self) -> list[str]:
        """The daemons the source's fleet registry holds as live, described."""
        return [
            f"daemon {daemon} (host {host}, pid {pid}) is live in the fleet registry"
            for daemon, host, pid in self.source.live_daemons(_now_ms(), LIVE_MS)
        ]

    def refuse_occupied(self, plan: Plan) -> None:
        """A target holding tasks that an earlier run of this move did not write is
        refused, unless merging."""
        if plan.target_tasks and not plan.resuming and not self.merge:
            raise MoveError(
                f"{plan.target} already holds {plan.target_tasks} tasks; refusing to move "
                "into it. Give --merge to add the source's tasks beside them (ids already "
                "there are skipped), or name an empty database"
            )

    # -- the move ----------------------------------------------------------------------

    def run(self, progress: ProgressFn | None = None) -> list[TableResult]:
        """Migrate the target and copy every table, carrying on after any earlier run
        of this move. The source's tables are checked against `TABLES` first."""
        self._check_tables()
        if not self.target.lock(self.source.path):
            raise MoveError(
                f"another move of {self.source.path} into {self.target.where} is running; "
                "let it finish (or end it) and run this again"
            )
        self.target.migrate()
        names = [t.name for t in TABLES]
        self.target.begin(self.source.path, names, _now_ms())
        done = self.target.progress(self.source.path)
        self._settle(min(p.started_at_ms for p in done.values()))
        results = []
        for table in names:
            results.append(self._move_table(table, done[table], progress))
        return results

    def _check_tables(self) -> None:
        unknown = sorted(set(self.source.tables()) - {t.name for t in TABLES} - set(SKIPPED))
        if unknown:
            raise MoveError(
                f"{self.source.path} holds tables this cairnqd does not know how to move: "
                f"{', '.join(unknown)}; is the file from a newer cairnqd?"
            )
        missing = [t.name for t in TABLES if t.name not in self.source.tables()]
        if missing:
            raise MoveError(f"{self.source.path}: tables missing: {', '.join(missing)}")

    def _settle(self, now_ms: int) -> None:
        """The running tasks and their open attempts, settled at the move's start."""
        task_cols = self.source.columns("cairnq_tasks")
        attempt_cols = self.source.columns("cairnqd_attempts")
        tasks, attempts = self.source.running()
        settled, closed = settle_running(
            task_cols,
            tasks,
            attempt_cols,
            attempts,
            now_ms=now_ms,
            error_json=LEASE_EXPIRED_ERROR_JSON,
        )
        self._settled_tasks = {self._key("cairnq_tasks", r): r for r in settled}
        self._settled_attempts = {self._key("cairnqd_attempts", r): r for r in closed}

    def _key(self, table: str, row: Row) -> Row:
        at = self._key_at.get(table)
        if at is None:
            columns = self.source.columns(table)
            at = self._key_at[table] = [columns.index(c) for c in self.source.primary_key(table)]
        return tuple(row[i] for i in at)

    def _source_batches(self, table: str, after: Sequence[Any] | None) -> Iterator[list[Row]]:
        """The source's rows of `table` after `after`, batch by batch, each row as it
        arrives on the target (running tasks settled)."""
        replace = {
            "cairnq_tasks": self._settled_tasks,
            "cairnqd_attempts": self._settled_attempts,
        }.get(table, {})
        while True:
            rows = self.source.batch(table, after, self.batch)
            if not rows:
                return
            if replace:
                rows = [replace.get(self._key(table, r), r) for r in rows]
            yield rows
            after = self._key(table, rows[-1])

    def _move_table(self, table: str, done: Progress, progress: ProgressFn | None) -> TableResult:
        # A table finished by an earlier run is read again after its last key, all the
        # same: rows added at the source since (a late submit) carry on from there.
        total = self.source.count(table)
        result = TableResult(table, total, done.moved, done.skipped)
        columns = self.source.columns(table)
        key = self.source.primary_key(table)
        if progress:
            progress(table, min(done.moved + done.skipped, total), total)
        for rows in self._source_batches(table, done.last_key):
            skipped = 0
            if self.merge:
                there = self.target.by_keys(
                    table, columns, key, [self._key(table, r) for r in rows]
                )
                kept = [r for r in rows if self._key(table, r) not in there]
                skipped = len(rows) - len(kept)
            else:
                kept = rows
            try:
                self.target.write(
                    self.source.path,
                    table,
                    columns,
                    kept,
                    last_key=self._key(table, rows[-1]),
                    skipped=skipped,
                    now_ms=_now_ms(),
                )
            except Exception as exc:
                from cairnqd.store.postgres.movetarget import RowsAlreadyThere

                first, last = self._key(table, rows[0]), self._key(table, rows[-1])
                hint = (
                    " (give --merge to skip rows the target already has)"
                    if isinstance(exc, RowsAlreadyThere)
                    else ""
                )
                raise MoveError(
                    f"{table}: the batch of keys {list(first)} to {list(last)} was not "
                    f"written: {' '.join(str(exc).split())}; rows before it are in place, "
                    f"and a re-run carries on from this batch{hint}"
                ) from exc
            result.moved += len(kept)
            result.skipped += skipped
            if progress:
                progress(table, min(result.moved + result.skipped, total), total)
        self.target.finish(self.source.path, table, _now_ms())
        if progress:
            progress(table, total, total)
        return result

    # -- verification ------------------------------------------------------------------

    def verify(self, results: list[TableResult]) -> Verdict:
        verdict = Verdict(results, settled=len(self._settled_tasks))
        skipped = {r.name: r.skipped for r in results}
        for table in TABLES:
            self._verify_table(table.name, skipped[table.name], verdict.differences)
        if not self.merge:
            expected = self.source.group_counts()
            for task in self._settled_tasks.values():
                columns = self.source.columns("cairnq_tasks")
                queue = task[columns.index("queue")]
                status = task[columns.index("status")]
                expected[(queue, "running")] -= 1
                expected[(queue, status)] = expected.get((queue, status), 0) + 1
            expected = {k: n for k, n in expected.items() if n}
            found = self.target.group_counts()
            for group in sorted(set(expected) | set(found)):
                if expected.get(group, 0) != found.get(group, 0):
                    verdict.differences.append(
                        f"cairnq_tasks queue {group[0]!r} status {group[1]}: "
                        f"{expected.get(group, 0)} at the source, {found.get(group, 0)} moved"
                    )
            for table in TABLES:
                there, here = self.source.count(table.name), self.target.count(table.name)
                if there != here:
                    verdict.differences.append(
                        f"{table.name}: {there} rows at the source, {here} on the target"
                    )
        return verdict

    def _verify_table(self, table: str, skipped: int, differences: list[str]) -> None:
        columns = self.source.columns(table)
        key = self.source.primary_key(table)
        types = self.target.column_types(table)
        text = RowText([types.get(c, "text") for c in columns])
        differing = 0
        for number, rows in enumerate(self._source_batches(table, None), start=1):
            keys = [self._key(table, r) for r in rows]
            there = self.target.by_keys(table, columns, key, keys)
            target_rows = [there.get(k) for k in keys]
            ours = text.checksum(rows)
            theirs = text.checksum(target_rows)
            if ours == theirs:
                continue
            bad = [
                k
                for k, r, t in zip(keys, rows, target_rows, strict=True)
                if t is None or text(r) != text(t)
            ]
            differing += len(bad)
            if not self.merge:
                differences.append(
                    f"{table} batch {number}: checksum {ours[:12]} at the source, "
                    f"{theirs[:12]} on the target; {len(bad)} rows differ, the first "
                    f"with key {list(bad[0]) if bad else '?'}"
                )
        if self.merge and differing > skipped:
            differences.append(
                f"{table}: {differing} rows differ from the source, but only {skipped} were "
                "kept from the target under --merge"
            )


# -- the checksum: one text per row, the same from either side -----------------------------


def _json_value(value: Any) -> Any:
    # SQLite keeps JSON as text; psycopg hands jsonb over parsed.
    return json.loads(value) if isinstance(value, str | bytes) else value


def _same(value: Any) -> Any:
    return value


def _reader(kind: str) -> Callable[[Any], Any]:
    """How a value of a column of type `kind` (the target's) is taken before it is
    written out: JSON parsed (its keys are sorted when written), numbers as Postgres
    types them."""
    if kind in ("jsonb", "json"):
        return _json_value
    if kind in ("double precision", "real"):
        return float
    if kind in ("integer", "bigint", "smallint"):
        return int
    return _same


class RowText:
    """Rows of one table written out as one JSON array each, values read by the target
    column's type, keys sorted: equal rows from either database give equal text."""

    def __init__(self, kinds: Sequence[str]) -> None:
        self._readers = [_reader(k) for k in kinds]

    def __call__(self, row: Row) -> str:
        values = [
            None if v is None else read(v) for read, v in zip(self._readers, row, strict=True)
        ]
        return json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    def checksum(self, rows: Sequence[Row | None]) -> str:
        """SHA-256 of a batch's rows in order; None (a row missing) counts too."""
        digest = hashlib.sha256()
        for row in rows:
            digest.update(b"<missing>" if row is None else self(row).encode())
            digest.update(b"\n")
        return digest.hexdigest()


__all__ = [
    "DEFAULT_BATCH",
    "SKIPPED",
    "TABLES",
    "Move",
    "MoveError",
    "Plan",
    "RowText",
    "Table",
    "TableResult",
    "Verdict",
]
