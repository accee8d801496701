"""`cairnqd` commands that work on the database, and the helpers every command shares.

Each command opens the store its config names, runs one coroutine and closes it;
`CliError(code, message)` is an expected failure. This module must not import
`cairnqd.cli` (docs/architecture.md, "The command line").
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import difflib
import json
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from cairnqd import storedvalues
from cairnqd._jsoncodec import MAX_JSON_DEPTH, shown, shown_json
from cairnqd._protocol import migrations
from cairnqd.attempts import AttemptRecord, attempts_shown
from cairnqd.cli import argtypes, inspect_text, inspect_tree, listing
from cairnqd.cli.argtypes import duration
from cairnqd.client import wait_for_task
from cairnqd.config import (
    Config,
    ConfigError,
    load_config,
    redact_dsn,
    to_ms,
)
from cairnqd.daemon import exitcodes
from cairnqd.errors import (
    AlreadyExists,
    DatabaseUnavailable,
    MigrationsPending,
    NotACairnqDatabase,
    ProtocolVersionMismatch,
    SchemaMismatch,
    SerializationError,
    TaskTimeout,
)
from cairnqd.models import CONFLICTS, JSON_COLUMNS, MS_COLUMNS, STATUSES, Task
from cairnqd.store.arguments import INT4_MAX, INT4_MIN, INT8_MAX, MAX_TEXT_BYTES
from cairnqd.store.base import TaskStore, wall_clock_ms
from cairnqd.store.dependencies import TaskGraph, is_waiting, state_shown
from cairnqd.store.errors import is_operational
from cairnqd.store.factory import missing_sqlite_file, store_for
from cairnqd.store.tables.fleet import FleetMember
from cairnqd.store.tables.limits import RoomWait

if TYPE_CHECKING:
    from cairnqd.limits import Limit

__all__ = [
    "CliError",
    "add_control",
    "add_migrate",
    "add_reads",
    "add_submit",
    "duration",
    "load",
    "table",
]

T = TypeVar("T")
if TYPE_CHECKING:
    # Any: the root parser's class is cli's own ArgumentParser subclass. Typing only:
    # _SubParsersAction is not subscriptable at runtime.
    Subparsers = argparse._SubParsersAction[Any]


class CliError(Exception):
    """An expected failure: `details` (e.g. config problems) then one line, and a code."""

    def __init__(self, code: int, message: str, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = list(details)


# -- shared helpers ----------------------------------------------------------------------


def load(path: str) -> Config:
    """The config, or CliError(78) carrying every problem as `file:line:col: ...`."""
    try:
        return load_config(path)
    except ConfigError as exc:
        count = len(exc.problems)
        noun = "problem" if count == 1 else "problems"
        message = f"{path}: {count} {noun} in the config"
        raise CliError(exitcodes.CONFIG, message, [str(p) for p in exc.problems]) from None


def describe_database(config: Config) -> str:
    db = config.database
    return f"sqlite {db.path}" if db.path is not None else f"postgres {redact_dsn(db.dsn or '')}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to fit; numbers right-aligned so counts line up. A cell's control
    characters are escaped: a queue or name another client stored may hold any."""
    cells = [[storedvalues.printable(str(c)) for c in row] for row in (headers, *rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [bool(rows) and all(isinstance(r[i], int) for r in rows) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [
            cell.rjust(w) if num else cell.ljust(w)
            for cell, w, num in zip(row, widths, numeric, strict=True)
        ]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def _one_line(exc: BaseException) -> str:
    # libpq's messages carry a tab-indented hint line; stderr gets one line per error.
    return " ".join(str(exc).split())


def _unavailable(config: Config, exc: BaseException) -> str:
    return f"{describe_database(config)}: {_one_line(exc)}"


def _when(ms: object) -> str:
    """Epoch milliseconds as UTC to the millisecond, from the integer (exact); a value
    that is no time as it is, marked."""
    return listing.clock(ms, millis=True, waiting="when its dependencies have succeeded")


def _default(value: Any) -> Any:
    """`json.dumps`'s `default`: a marker for a value that cannot be decoded (`shown`),
    and a blob another client stored where text belongs as its escaped text, marked."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {"undecodable": "not text", "raw": storedvalues.raw_text(value)}
    return shown(value)


def _json(value: Any, indent: int | None = 2) -> str:
    # A value another client stored that cannot be decoded shows as its escaped text;
    # a number JSON cannot carry (1e999, read as infinite) as a marker: valid JSON.
    return shown_json(value, indent=indent, default=_default)


# -- the store -----------------------------------------------------------------------------


def open_store(config: Config, *, migrate: bool | None = None) -> TaskStore:
    """A store on the configured database. Admin commands migrate only where
    `database.auto_migrate` allows; `cairnqd migrate` always does."""
    return store_for(config.database, "cli", migrate=migrate)


def require_database(config: Config) -> None:
    """CliError(66) when the SQLite database does not exist: see the module docstring."""
    path = missing_sqlite_file(config.database)
    if path is not None:
        where = f" (database.path in {config.source})" if config.source else ""
        raise CliError(
            exitcodes.NOINPUT,
            f"no database at {path}{where}; `cairnqd -c {config.source or 'FILE'} migrate` "
            "or the daemon creates it",
        )


def with_store(
    config: Config,
    action: Callable[[TaskStore], Awaitable[T]],
    *,
    migrate: bool | None = None,
    create: bool = False,
) -> T:
    """Connect, run `action`, close; database failures become CliError (69 or 65).
    A missing SQLite file is CliError(66) unless `create`."""
    if not create:
        require_database(config)

    async def session() -> T:
        async with open_store(config, migrate=migrate) as store:
            return await action(store)

    return run_on_database(config, session)


def run_on_database(config: Config, session: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run `session` (which opens the store itself); its database failures become
    CliError (69, or 65 for a database that is not what it should be)."""
    try:
        return asyncio.run(session())
    except DatabaseUnavailable as exc:  # already names the (redacted) DSN
        raise CliError(exitcodes.UNAVAILABLE, _one_line(exc)) from None
    except (
        NotACairnqDatabase,
        ProtocolVersionMismatch,
        SchemaMismatch,
        MigrationsPending,
    ) as exc:
        raise CliError(exitcodes.DATAERR, _one_line(exc)) from None
    except Exception as exc:
        if not is_operational(exc):
            raise
        raise CliError(exitcodes.UNAVAILABLE, _unavailable(config, exc)) from None


# -- migrate, stats ------------------------------------------------------------------------


async def _migrate(
    store: TaskStore,
) -> tuple[int, dict[str, list[tuple[str, int]]], list[FleetMember]]:
    return (
        await store.protocol_version(),
        await store.applied_migrations(),
        await store.fleet.live(),
    )


def pending_migrations(config: Config) -> list[str]:
    """The migrations the database lacks, without applying any."""
    if missing_sqlite_file(config.database) is not None:
        return [m.name for m in migrations("sqlite")]

    async def session() -> list[str]:
        try:
            async with open_store(config, migrate=False):
                return []
        except MigrationsPending as exc:
            return exc.names

    return run_on_database(config, session)


def cmd_migrate(args: argparse.Namespace) -> int:
    # Here: cli/fleet.py builds on this module.
    from cairnqd.cli.fleet import fleet_lines

    config = load(args.config)
    before = pending_migrations(config)
    if args.dry_run:
        print(f"database: {describe_database(config)}")
        if not before:
            print("nothing to apply: the database is up to date")
        else:
            print(f"would apply {len(before)} migration(s), in this order:")
            for name in before:
                print(f"  {name}")
        return exitcodes.OK
    version, ledgers, members = with_store(config, _migrate, migrate=True, create=True)
    print(f"database: {describe_database(config)}")
    print(f"protocol_version: {version}")
    for ledger, rows in ledgers.items():
        print(f"{ledger}:")
        print(
            table(
                ["  NAME", "APPLIED_AT", ""],
                [[f"  {n}", _when(at), "applied now" if n in before else ""] for n, at in rows],
            )
        )
    applied = [n for n in before if any(n == row[0] for rows in ledgers.values() for row in rows)]
    print(f"applied now: {len(applied)}" + (f" ({', '.join(applied)})" if applied else ""))
    print("fleet (the daemons on this database now):")
    for line in fleet_lines(members):
        print(f"  {line}")
    return exitcodes.OK


#: Under `stats`: what RUNNING counts (a prefetching worker holds more than it runs).
RUNNING_NOTE = (
    "RUNNING counts every claimed task, including those a worker holds claimed ahead "
    "(prefetched) and has not started; `cairnqd status` shows executing vs held."
)


#: Under `stats`, when a task waits on its dependencies.
WAITING_NOTE = (
    "WAITING counts the QUEUED tasks held until every task they were submitted after "
    "has succeeded (docs/workflows.md); they are not due yet."
)


async def _stats(
    store: TaskStore, queue: str | None
) -> tuple[dict[str, dict[str, int]], set[str], dict[str, int]]:
    paused = {p.queue for p in await store.pauses.all()}
    waiting = await store.waiting_counts()
    if queue is not None:
        waiting = {q: n for q, n in waiting.items() if q == queue}
    return await store.stats(queue), paused if queue is None else paused & {queue}, waiting


def _by_status(
    counts: dict[Any, dict[Any, int]],
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """Per queue, the protocol's statuses' counts, and apart those of any other status
    (another client wrote `paused` or `QUEUED` with the table's CHECK off): counted in
    no status column, they would leave a row that does not add up. A queue or status
    that is not text (a blob) is keyed by its escaped text, marked."""
    known: dict[str, dict[str, int]] = {}
    other: dict[str, dict[str, int]] = {}
    for queue, by_status in counts.items():
        key = queue if isinstance(queue, str) else storedvalues.unreadable(queue)
        mine = known.setdefault(key, dict.fromkeys(STATUSES, 0))
        theirs = other.setdefault(key, {})
        for status, n in by_status.items():
            if isinstance(status, str) and status in STATUSES:
                mine[status] += n
            else:
                shown_as = status if isinstance(status, str) else storedvalues.raw_text(status)
                theirs[shown_as] = theirs.get(shown_as, 0) + n
    return known, other


def other_note(other: dict[str, dict[str, int]]) -> str | None:
    """What OTHER counts, naming each status and how many hold it; None for none."""
    merged: dict[str, int] = {}
    for by_status in other.values():
        for status, n in by_status.items():
            merged[status] = merged.get(status, 0) + n
    if not merged:
        return None
    named = ", ".join(f"'{storedvalues.raw_text(s)}': {n}" for s, n in sorted(merged.items()))
    return (
        f"OTHER counts {sum(merged.values())} task(s) whose status is none of the protocol's "
        f"({named}): another client wrote them, and no worker claims them. `cairnqd list` "
        f"shows them, their status marked {storedvalues.UNREADABLE}."
    )


def cmd_stats(args: argparse.Namespace) -> int:
    config = load(args.config)
    counts, paused, waiting = with_store(config, lambda store: _stats(store, args.queue))
    known, other = _by_status(counts)
    note = other_note(other)
    if args.json:
        out: dict[str, dict[str, Any]] = {}
        for queue, by_status in sorted(known.items()):
            out[queue] = {**by_status, "waiting": waiting.get(queue, 0)}
            # TOTAL is the sum of the five and `other`; `other_statuses` says which.
            out[queue]["other"] = sum(other[queue].values())
            if other[queue]:
                out[queue]["other_statuses"] = dict(sorted(other[queue].items()))
        print(_json(out))
        if note is not None:
            print(f"cairnqd: warning: {note}", file=sys.stderr)
        return exitcodes.OK
    for queue in paused:  # a paused queue shows even when it holds no task
        known.setdefault(queue, dict.fromkeys(STATUSES, 0))
        other.setdefault(queue, {})
    # WAITING (a part of QUEUED, not added to TOTAL) shows only when a task waits;
    # OTHER (added to TOTAL) only when a task holds a status the protocol does not have.
    extra = (["WAITING"] if waiting else []) + (["OTHER"] if note is not None else [])
    rows: list[list[Any]] = [
        [queue, *(by_status[s] for s in STATUSES),
         *([waiting.get(queue, 0)] if waiting else []),
         *([sum(other[queue].values())] if note is not None else []),
         sum(by_status.values()) + sum(other[queue].values()),
         "paused" if queue in paused else ""]
        for queue, by_status in sorted(known.items())
    ]  # fmt: skip
    if len(rows) > 1:
        totals = [sum(r[i] for r in rows) for i in range(1, len(STATUSES) + 2 + len(extra))]
        rows.append(["(all)", *totals, ""])
    print(table(["QUEUE", *(s.upper() for s in STATUSES), *extra, "TOTAL", ""], rows))
    if not rows:
        print("(no tasks)")
    else:
        if waiting:
            print(WAITING_NOTE)
        if note is not None:
            print(note)
        print(RUNNING_NOTE)
    return exitcodes.OK


# -- list, inspect -------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    config = load(args.config)
    tasks, total = with_store(config, lambda store: _list(store, args))
    if args.json:
        print(_json([listing.json_row(t) for t in tasks]))
        listing.warn_odd(tasks)
        return exitcodes.OK
    print(table(listing.LIST_HEADERS, listing.list_rows(tasks, wall_clock_ms())))
    listing.warn_odd(tasks)
    if not tasks:
        print("(no tasks)")
    more = listing.more_line(total, args.offset, len(tasks))
    if more is not None:
        print(more)
    return exitcodes.OK


async def _list(store: TaskStore, args: argparse.Namespace) -> tuple[list[Task], int]:
    if args.waiting:  # queued behind their dependencies (docs/workflows.md)
        return await store.waiting(
            queue=args.queue, name=args.name, limit=args.limit, offset=args.offset
        )
    filters = {"status": args.status, "queue": args.queue, "name": args.name}
    tasks = await store.list(**filters, limit=args.limit, offset=args.offset)
    if args.json or len(tasks) < args.limit:
        return tasks, args.offset + len(tasks)  # nothing beyond this page
    return tasks, await store.bulk.count(listing.matching(**filters))


def _one_target(args: argparse.Namespace) -> tuple[str | None, str | None]:
    if (args.task_id is None) == (args.key is None):
        raise CliError(exitcodes.USAGE, f"{args.command}: give a TASK_ID or --key KEY (one)")
    return args.task_id, args.key


async def _fetch(store: TaskStore, task_id: str | None, key: str | None) -> Task | None:
    return await (store.get(task_id) if task_id is not None else store.get_by_key(key or ""))


def _missing(task_id: str | None, key: str | None) -> CliError:
    what = f"no task {task_id}" if task_id is not None else f"no task with key {key!r}"
    return CliError(exitcodes.NOTHING_DONE, what)


@dataclasses.dataclass(frozen=True)
class _Inspected:
    """What `inspect` prints of one task beside its row."""

    task: Task
    waits: list[RoomWait]
    records: list[AttemptRecord]
    parents: list[Task]
    dependents: list[Task]


def cmd_inspect(args: argparse.Namespace) -> int:
    task_id, key = _one_target(args)
    config = load(args.config)
    if args.follow:
        return _follow(config, task_id, key)
    if args.tree:
        return _tree(config, task_id, key, args.json)
    limits = config.flow_limits()

    async def read(store: TaskStore) -> _Inspected | None:
        task = await _fetch(store, task_id, key)
        if task is None:
            return None
        # A queued, due task that a full limit holds back says so (docs/limits.md).
        waits = await store.limit_table.waiting_for(task, limits) if limits else []
        return _Inspected(
            task,
            waits,
            await store.attempts.of(task.id),
            # The tasks it was submitted after, and those after it (docs/workflows.md).
            await store.dependencies(task.id),
            await store.dependents(task.id),
        )

    seen = with_store(config, read)
    if seen is None:
        raise _missing(task_id, key)
    task, records = seen.task, seen.records
    listing.warn_odd([task])
    if args.json:
        data = listing.json_row(task)
        data["waiting_for"] = [w.to_json() for w in seen.waits]
        data["error_attempt"] = inspect_text.error_attempt(task, records)
        data["attempts"] = [r.to_json() for r in records]
        data["after"] = [_linked(t) for t in seen.parents]
        data["dependents"] = [_linked(t) for t in seen.dependents]
        print(_json(data))
        return exitcodes.OK
    for field in dataclasses.fields(Task):
        if field.name == "error":
            continue  # below, labelled, its traceback as text
        if field.name == "attempt":  # beside its budget: 2/3
            print(f"attempt: {storedvalues.attempts_text(task.attempt, task.max_attempts)}")
            continue
        print(f"{field.name}:{_shown(field.name, getattr(task, field.name))}")
    for label, linked in (("after", seen.parents), ("dependents", seen.dependents)):
        if linked:
            print(f"{label}: " + ", ".join(_linked_text(t) for t in linked))
    for wait in seen.waits:
        print(wait.describe())
    if task.error is not None:
        print(inspect_text.error_heading(task, records))
        # The attempt that wrote it shows its traceback below, once.
        known = inspect_text.error_attempt(task, records) is not None
        for line in inspect_text.envelope_lines(task.error, traceback=not known):
            print(line)
    for line in inspect_text.attempt_lines(records, wall_clock_ms(), _when, table):
        print(line)
    return exitcodes.OK


def _linked(task: Task) -> dict[str, Any]:
    row = listing.json_row(task)
    return {
        "id": row["id"],
        "name": row["name"],
        "status": row["status"],
        "waiting": is_waiting(task),
    }


def _linked_text(task: Task) -> str:
    state = state_shown(task.status, task.run_at_ms)
    return f"{listing.text_value(task.id)} ({listing.state_text(state)})"


def _tree(config: Config, task_id: str | None, key: str | None, as_json: bool) -> int:
    async def read(store: TaskStore) -> tuple[Task, TaskGraph] | None:
        task = await _fetch(store, task_id, key)
        if task is None:
            return None
        try:
            return task, await store.graph(task.id)
        except (ValueError, TypeError, OverflowError) as exc:
            # A row of the graph holds what its reader cannot take (text where an
            # integer belongs, another client's): say so, and which task it was about.
            raise CliError(
                exitcodes.DATAERR,
                f"inspect --tree: the dependency graph of task {storedvalues.raw_text(task.id)} "
                f"holds a row another client wrote that cannot be read ({_one_line(exc)}); "
                "`cairnqd list` and `inspect TASK_ID` show such rows, marked "
                f"{storedvalues.UNREADABLE}",
            ) from None

    found = with_store(config, read)
    if found is None:
        raise _missing(task_id, key)
    task, graph = found
    if as_json:
        print(_json(graph.to_json()))
        return exitcodes.OK
    print(inspect_tree.summary(graph))
    for line in inspect_tree.tree_lines(graph, task.id):
        print(line)
    return exitcodes.OK


def _follow(config: Config, task_id: str | None, key: str | None) -> int:
    async def watch(store: TaskStore) -> Task | None:
        task = await _fetch(store, task_id, key)
        return None if task is None else await listing.follow(store, task.id)

    task = with_store(config, watch)
    if task is None:
        raise _missing(task_id, key)
    return listing.follow_done(task)


def _shown(field: str, value: Any) -> str:
    """One inspect value: JSON pretty-printed and indented under its name, epoch
    milliseconds with their UTC time beside them, `attempt` beside its budget; a value
    another client stored that its column's readers cannot take as it is, marked."""
    if field in JSON_COLUMNS:
        text = "null" if value is None else _json(value)
        return "\n  " + text.replace("\n", "\n  ") if "\n" in text else f" {text}"
    if value is None:
        return " -"
    if field in MS_COLUMNS:
        when = _when(value)
        return f" {when}" if when.endswith(storedvalues.UNREADABLE) else f" {value} ({when})"
    if field in listing.INT_COLUMNS:
        return f" {listing.number(value)}"
    if field == "progress":
        return (
            f" {value}"
            if storedvalues.fraction(value) is not None
            else f" {storedvalues.unreadable(value)}"
        )
    if field == "status":
        return f" {listing.status_text(value)}"
    return f" {listing.text_value(value)}"


# -- submit --------------------------------------------------------------------------------


def _payload(args: argparse.Namespace) -> Any:
    source, text = "--payload", args.payload
    if args.payload_file is not None:
        source = args.payload_file
        try:
            if args.payload_file == "-":
                text = sys.stdin.read()
            else:
                text = Path(args.payload_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
            raise CliError(exitcodes.NOINPUT, f"cannot read {source}: {reason}") from None
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno} (char {exc.pos})"
        raise CliError(exitcodes.DATAERR, f"{source}: invalid JSON at {where}: {exc.msg}") from None
    except RecursionError:
        # Nested past Python's stack (about a thousand levels): far past what the store
        # takes, so the store's own refusal, which a shallower payload gets.
        raise CliError(
            exitcodes.DATAERR,
            f"submit: payload nests more than {MAX_JSON_DEPTH} levels deep; JSON values "
            f"may nest at most {MAX_JSON_DEPTH} levels",
        ) from None


def unserved_task(config: Config, name: str, queue: str) -> str | None:
    """Why no group of `config` would run task `name` from `queue`, or None when one
    would (or the config runs no groups to judge by). Imports the groups' handlers as
    a child would, in a probe process."""
    if not config.groups:
        return None
    groups = [g for g in config.groups.values() if queue in g.queues]
    if not groups:
        queues = sorted({q for g in config.groups.values() for q in g.queues})
        return (
            f"no group in {config.source or 'the config'} claims queue {queue!r} (they claim "
            f"{', '.join(queues)}): the task would wait until one does"
        )
    from cairnqd.daemon.handler_probe import probe_handlers

    lists = list(dict.fromkeys(g.handlers for g in groups))
    timeout = config.supervisor.boot_timeout.total_seconds()
    results = probe_handlers(config.python_path, lists, timeout)
    if any(name in r.names for r in results):
        return None
    if not any(r.ok for r in results):
        return f"cannot tell whether task {name!r} is handled: {results[0].error}"
    known = sorted({n for r in results for n in r.names})
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    served_by = ", ".join(g.name for g in groups)
    return (
        f"no handler for task {name!r} in the groups claiming queue {queue!r} "
        f"({served_by}){hint}: the task would wait, unclaimed"
    )


async def _held_back(store: TaskStore, task: Task | None, limits: Sequence[Limit]) -> str | None:
    """Why a queued task a wait gave up on was not claimed, when a limit of the config
    covers it: each full budget it waits for, or that the limit covers it though it had
    room when asked. None when no limit covers it (or it is not queued)."""
    if task is None or task.status != "queued":
        return None
    covering = [limit.name for limit in limits if limit.covers(task.queue, task.name)]
    if not covering:
        return None
    waits = await store.limit_table.waiting_for(task, limits)
    if waits:
        return "not claimed yet: " + "; ".join(w.describe() for w in waits)
    names = ", ".join(covering)
    return f"limit {names} covers it, and had room for it just now"


async def _submit(
    store: TaskStore, args: argparse.Namespace, payload: Any, limits: Sequence[Limit] = ()
) -> tuple[Task, Task]:
    task = await store.submit(
        name=args.name,
        payload=payload,
        queue=args.queue,
        key=args.key,
        conflict=args.conflict or "reuse",
        max_attempts=args.max_attempts,
        priority=args.priority,
        delay_ms=to_ms(args.delay),
        after=args.after or None,
    )
    if not args.wait:
        return task, task
    # The id first, so a caller whose wait times out can still follow the task.
    print(task.id, flush=True)
    timeout_ms = to_ms(args.timeout)
    try:
        done = await wait_for_task(
            store, task.id, None, timeout_ms=timeout_ms, poll_ms=50, max_poll_ms=500
        )
    except TaskTimeout as exc:
        # "never claimed: is a worker running?" is the wrong guess for a task a full
        # rate or concurrency limit of the config holds back (docs/limits.md).
        held = await _held_back(store, exc.task, limits)
        if held is None:
            raise
        if held.startswith("limit "):  # it had room: the first guess may still be right
            raise CliError(exitcodes.TEMPFAIL, f"{exc} ({held})") from None
        raise CliError(
            exitcodes.TEMPFAIL, f"task {task.id} did not finish within {timeout_ms}ms: {held}"
        ) from None
    return task, done


def cmd_submit(args: argparse.Namespace) -> int:
    if args.timeout is not None and not args.wait:
        raise CliError(exitcodes.USAGE, "submit: --timeout needs --wait")
    if args.conflict is not None and args.key is None:
        # A keyless task conflicts with nothing: the option would be silently ignored.
        raise CliError(
            exitcodes.USAGE,
            "submit: --conflict needs --key (it says what to do when the key is taken)",
        )
    if args.timeout is None:  # `--timeout 0s` is a wait of no time, not the default
        args.timeout = timedelta(seconds=30)
    payload = _payload(args)
    config = load(args.config)
    unserved = unserved_task(config, args.name, args.queue)
    if unserved is not None:
        if args.strict:
            raise CliError(exitcodes.DATAERR, f"submit: {unserved}; nothing was submitted")
        print(f"cairnqd: warning: {unserved} (--strict refuses)", file=sys.stderr)
    try:
        limits = config.flow_limits()
        task, done = with_store(config, lambda store: _submit(store, args, payload, limits))
    except AlreadyExists as exc:
        raise CliError(exitcodes.NOTHING_DONE, str(exc)) from None
    except (ValueError, SerializationError) as exc:
        raise CliError(exitcodes.DATAERR, f"submit: {exc}") from None
    except TaskTimeout as exc:
        raise CliError(exitcodes.TEMPFAIL, str(exc)) from None
    if not args.wait:
        print(task.id)
        return exitcodes.OK
    if done.status == "succeeded":
        print(_json(done.result))
        return exitcodes.OK
    # One line: the envelope, compact.
    detail = f": {_json(done.error, indent=None)}" if done.error is not None else ""
    print(f"task {done.id} {listing.status_text(done.status)}{detail}", file=sys.stderr)
    return exitcodes.NOTHING_DONE


# -- cancel, retry -------------------------------------------------------------------------


async def _cancel(
    store: TaskStore, task_id: str | None, key: str | None
) -> tuple[Task | None, bool]:
    """The task a cancel leaves, and whether it changed anything: a running task whose
    cancel was already requested is left as it is (the statement would only re-stamp
    the request; the handler settles it as canceled either way)."""
    before = await _fetch(store, task_id, key)
    if (
        before is not None
        and before.status == "running"
        and before.cancel_requested_at_ms is not None
    ):
        return before, False
    if task_id is not None:
        return await store.cancel(task_id), True
    return await store.cancel_by_key(key or ""), True


async def _retry(
    store: TaskStore, task_id: str | None, key: str | None, reset: bool
) -> Task | None:
    if task_id is not None:
        return await store.retry(task_id, reset_attempt=reset)
    return await store.retry_by_key(key or "", reset_attempt=reset)


def _unchanged(config: Config, task_id: str | None, key: str | None, allowed: str) -> CliError:
    """Why a cancel or retry changed nothing: no such task, or the wrong status. Read
    after the fact, so the status shown may be newer than the one that refused."""
    task = with_store(config, lambda store: _fetch(store, task_id, key))
    if task is None:
        return _missing(task_id, key)
    return CliError(exitcodes.NOTHING_DONE, f"task {task.id} is {task.status}: {allowed}")


def cmd_cancel(args: argparse.Namespace) -> int:
    task_id, key = _one_target(args)
    config = load(args.config)
    task, changed = with_store(config, lambda store: _cancel(store, task_id, key))
    if task is None:
        raise _unchanged(config, task_id, key, "only queued or running tasks can be canceled")
    if not changed:  # docs/operations.md, section 7: no state change exits 1
        raise CliError(
            exitcodes.NOTHING_DONE,
            f"task {task.id} is running and its cancel was already requested "
            f"({_when(task.cancel_requested_at_ms)}); its handler settles it as canceled: "
            "nothing changed",
        )
    if task.status == "running":
        print(f"{task.id} running (cancel requested; its handler settles it as canceled)")
    else:
        print(f"{task.id} {task.status}")
    return exitcodes.OK


def cmd_retry(args: argparse.Namespace) -> int:
    task_id, key = _one_target(args)
    config = load(args.config)
    reset = args.reset_attempt
    task = with_store(config, lambda store: _retry(store, task_id, key, reset))
    if task is None:
        raise _unchanged(config, task_id, key, "only failed or canceled tasks can be retried")
    print(f"{task.id} {task.status} (attempt {attempts_shown(task.attempt, task.max_attempts)})")
    return exitcodes.OK


# -- the parsers ---------------------------------------------------------------------------
# One function per group of commands; `cli.main.COMMANDS` lists them in help order.


def _add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "task_id", nargs="?", type=argtypes.text, metavar="TASK_ID", help="the task's id"
    )
    parser.add_argument(
        "--key", type=argtypes.text, help="the task's idempotency key instead of its id"
    )


def add_migrate(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "migrate",
        parents=parents,
        help="create or upgrade the database schema; show both ledgers",
        description="Apply every pending migration (creating the SQLite file if needed) and "
        "print both migration ledgers: the protocol's (cairnq_migrations) and cairnqd's own "
        "(cairnqd_migrations), marking those this run applied. Safe to run while daemons "
        "run: each migration applies once, and on Postgres none waits more than 2 s for a "
        "lock (it gives up and tries again), so claims never queue behind it for longer.",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="list the migrations that would run; apply none"
    )
    p.set_defaults(func=cmd_migrate)


def add_submit(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "submit",
        parents=parents,
        help="submit a task; prints its id (--wait: its result)",
        description="Submit one task and print its id. With --wait, also wait for it to "
        "finish and print its result as JSON; a task that fails or is canceled exits 1.",
    )
    # Name, queue and key as the store bounds them, so a bad one is refused by its option.
    stored = argtypes.bounded_text(MAX_TEXT_BYTES)
    p.add_argument("name", type=stored, metavar="NAME", help="the task name (a handler's name)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--payload", metavar="JSON", help="the payload as JSON text")
    source.add_argument("--payload-file", metavar="FILE", help="read the JSON payload (- stdin)")
    p.add_argument(
        "--queue", type=stored, default="default", help="the queue (default: %(default)s)"
    )
    p.add_argument("--key", type=stored, help="idempotency key: one task per key")
    p.add_argument(
        "--conflict",
        choices=CONFLICTS,
        # None, not reuse: given without --key, it is refused rather than ignored.
        help="with --key, when the key is taken: %(choices)s (default: reuse)",
    )
    p.add_argument(
        "--max-attempts",
        type=argtypes.integer(1, INT4_MAX),
        default=3,
        metavar="N",
        help="attempts before it fails for good (default: %(default)s)",
    )
    p.add_argument(
        "--priority",
        type=argtypes.integer(INT4_MIN, INT4_MAX),
        default=0,
        metavar="N",
        help="higher runs first (0)",
    )
    p.add_argument(
        "--delay",
        type=argtypes.bounded_duration(),
        default=timedelta(0),
        metavar="DURATION",
        help="run no earlier than this from now (e.g. 30s, 5m)",
    )
    p.add_argument(
        "--after",
        action="append",
        type=argtypes.text,
        metavar="TASK_ID",
        help="run only once this task has succeeded (repeat for several; canceled if one "
        "fails; docs/workflows.md)",
    )
    p.add_argument("--wait", action="store_true", help="wait for the outcome; print the result")
    p.add_argument(
        "--timeout", type=argtypes.bounded_duration(), metavar="DURATION", help="with --wait (30s)"
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse (exit 65) a task no group of the config would run: a name no handler "
        "registers, or a queue no group claims (without it: a warning)",
    )
    p.set_defaults(func=cmd_submit)


def add_reads(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "stats",
        parents=parents,
        help="task counts per queue and status",
        description="Count the tasks of every queue by status. RUNNING counts every claimed "
        "task, including those a worker holds ahead (prefetch) and has not started yet.",
    )
    p.add_argument("--queue", type=argtypes.text, help="only this queue")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser(
        "list",
        parents=parents,
        help="list tasks, newest first",
        description="List tasks, newest first, optionally filtered.",
    )
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--status", choices=STATUSES, help="only tasks in this status")
    shown.add_argument(
        "--waiting",
        action="store_true",
        help="only queued tasks waiting for their dependencies to succeed (docs/workflows.md)",
    )
    p.add_argument("--queue", type=argtypes.text, help="only this queue")
    p.add_argument("--name", type=argtypes.text, help="only this task name")
    # At least 1: an empty page cannot say where the next one starts.
    p.add_argument(
        "--limit",
        type=argtypes.integer(1, INT8_MAX),
        default=100,
        metavar="N",
        help="at most N (100)",
    )
    p.add_argument(
        "--offset",
        type=argtypes.integer(0, INT8_MAX),
        default=0,
        metavar="N",
        help="skip the first N",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "inspect",
        parents=parents,
        help="show one task in full",
        description="Show every field of one task: payload, result, error envelope (with "
        "the handler's traceback as text, and which attempt left it), times in UTC; then "
        "every attempt with its outcome, worker, host, duration and error (--json: "
        "attempts); for a due task that a full flow-control limit of the config holds back, "
        "which budget it waits for (--json: waiting_for).",
    )
    _add_target(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--follow", action="store_true", help="print progress until the task ends")
    p.add_argument(
        "--tree",
        action="store_true",
        help="draw the dependency graph the task belongs to, from its roots, with each "
        "task's state (--json: the graph's tasks with their `after`; docs/workflows.md)",
    )
    p.set_defaults(func=cmd_inspect)


def add_control(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "cancel",
        parents=parents,
        help="cancel a queued or running task",
        description="Cancel a queued task at once; a running one is asked to stop and its "
        "handler settles it as canceled. A finished task, or a running one whose cancel "
        "was already requested, is left alone (exit 1).",
    )
    _add_target(p)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser(
        "retry",
        parents=parents,
        help="run a failed or canceled task again",
        description="Queue a failed or canceled task again. Other statuses exit 1.",
    )
    _add_target(p)
    p.add_argument("--reset-attempt", action="store_true", help="give back its full attempts")
    p.set_defaults(func=cmd_retry)
