"""`cairnqd move-to DSN`: copy a SQLite installation's database into Postgres
(docs/operations.md, "Moving from SQLite to Postgres").

The copy itself is `cairnqd/store/move.py`; this module decides whether it may run
(no daemon on the file unless `--live`, no foreign tasks on the target unless
`--merge`), pauses the source under `--live`, shows the progress and prints the
verdict.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import IO, TYPE_CHECKING, Any

from cairnqd.cli.admin import CliError, load, with_store
from cairnqd.cli.queues import operator_name
from cairnqd.config import Config
from cairnqd.config.dsn import dsn_problem
from cairnqd.daemon import exitcodes
from cairnqd.daemon.parent.statefile import StateFile, running_masters, state_path
from cairnqd.errors import DatabaseUnavailable, NotACairnqDatabase, ProtocolVersionMismatch
from cairnqd.queue_counts import FLUSH_EVERY_S
from cairnqd.store.base import TaskStore
from cairnqd.store.move import DEFAULT_BATCH, SKIPPED, TABLES, Move, MoveError, Plan

if TYPE_CHECKING:
    from cairnqd.cli.admin import Subparsers

#: What `--live` writes as the reason of the pauses it makes.
LIVE_REASON = "cairnqd move-to --live: moving to Postgres"


class ProgressView:
    """A bar with rows/s and ETA on a terminal; a plain line every few seconds (and
    at each table's end) elsewhere."""

    def __init__(self, stream: IO[str], total: int, *, tty: bool | None = None) -> None:
        self.stream = stream
        self.total = max(total, 1)
        self.tty = stream.isatty() if tty is None else tty
        self.started = time.monotonic()
        self._finished: dict[str, int] = {}
        self._earlier: dict[str, int] = {}
        self._last_line = self.started

    def __call__(self, table: str, done: int, of: int) -> None:
        if table in self._finished:
            return
        # The first call of a table says what earlier runs of the move did: not this
        # run's speed.
        earlier = self._earlier.setdefault(table, done)
        if done >= of:
            self._finished[table] = of
        moved = sum(self._finished.values()) + (0 if done >= of else done)
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = max(moved - sum(self._earlier.values()), 0) / elapsed
        if done >= of and earlier >= of:
            return  # finished by an earlier run: nothing to show
        left = (self.total - moved) / rate if rate > 0 else float("inf")
        eta = "--:--" if left == float("inf") else f"{int(left) // 60:d}:{int(left) % 60:02d}"
        share = min(moved / self.total, 1.0)
        if self.tty:
            width = 30
            bar = "#" * int(share * width) + "." * (width - int(share * width))
            line = (
                f"\r[{bar}] {share:4.0%} {moved:,}/{self.total:,} rows "
                f"{rate:,.0f} rows/s ETA {eta}  {table:<24}"
            )
            self.stream.write(line)
            self.stream.flush()
            return
        now = time.monotonic()
        if done >= of or now - self._last_line >= 5.0:
            self._last_line = now
            print(
                f"move: {table} {done:,}/{of:,}; {moved:,}/{self.total:,} rows in all, "
                f"{rate:,.0f} rows/s, ETA {eta}",
                file=self.stream,
                flush=True,
            )

    def end(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _target_dsn(args: argparse.Namespace) -> str:
    if (args.dsn is None) == (args.to_config is None):
        raise CliError(
            exitcodes.USAGE, "move-to: give the target as DSN or as --to-config FILE (one of them)"
        )
    if args.dsn is not None:
        dsn: str = args.dsn
        where = "move-to DSN"
    else:
        target = load(args.to_config)
        if target.database.dsn is None:
            raise CliError(
                exitcodes.USAGE,
                f"move-to --to-config {args.to_config}: its database section names a SQLite "
                f"path ({target.database.path}), not a Postgres dsn",
            )
        dsn = target.database.dsn
        where = f"database.dsn in {args.to_config}"
    problem = dsn_problem(dsn)
    if problem is not None:
        raise CliError(exitcodes.USAGE, f"move-to: {where}: {problem}")
    return dsn


def _source_path(config: Config) -> str:
    path = config.database.path
    if path is None:
        raise CliError(
            exitcodes.USAGE,
            f"move-to: {config.source} already uses Postgres; move-to moves a SQLite database",
        )
    if not os.path.isfile(path):
        raise CliError(exitcodes.NOINPUT, f"move-to: no SQLite database at {path}")
    return path


def daemons_on(config_path: str, runtime_dir: str, move: Move) -> list[str]:
    """Why we believe a daemon runs on the source: the state file's lock of this config
    or a process titled as its master, and any daemon live in the file's fleet registry
    (another config on the same file, another host on a shared disk)."""
    found: list[str] = []
    statefile = StateFile(state_path(config_path, runtime_dir))
    if statefile.locked_by_other():
        found.append(f"the daemon for {config_path} holds {statefile.lock_path}")
    for pid, _ in running_masters(config_path):
        found.append(f"pid {pid} is the cairnqd master for {config_path}")
    found.extend(move.live_daemons())
    return list(dict.fromkeys(found))


def _queues_of(config: Config) -> list[str]:
    async def read(store: TaskStore) -> list[str]:
        return sorted(await store.stats())

    claimed = {q for g in config.groups.values() for q in g.queues}
    return sorted(claimed | set(with_store(config, read, migrate=False)))


def pause_and_wait(config: Config, timeout_s: float, out: IO[str]) -> list[str]:
    """`--live`: pause every queue at the source, then wait (at most `timeout_s`) for
    its running tasks to end. The queues paused by this call."""
    queues = _queues_of(config)

    async def pause(store: TaskStore) -> list[str]:
        if not queues:
            return []
        made = await store.pauses.pause(queues, paused_by=operator_name(), reason=LIVE_REASON)
        return [p.queue for p in made]

    paused = with_store(config, pause, migrate=False)
    print(
        f"move: paused {len(paused)} queues at the source "
        f"({', '.join(paused) if paused else 'all were paused already'})",
        file=out,
        flush=True,
    )

    async def running(store: TaskStore) -> int:
        return sum(c.get("running", 0) for c in (await store.stats()).values())

    deadline = time.monotonic() + timeout_s
    last = -1
    while True:
        n = with_store(config, running, migrate=False)
        if n == 0 and last > 0:
            # The workers add the counts of the attempts that just ended at their next
            # flush: let that land at the source before it is copied.
            settle = FLUSH_EVERY_S + 2.0
            print(
                f"move: no task runs at the source; {settle:.0f} s for the workers' last "
                "queue counts",
                file=out,
                flush=True,
            )
            time.sleep(settle)
            return paused
        if n == 0:
            print("move: no task runs at the source", file=out, flush=True)
            return paused
        if n != last:
            left = max(deadline - time.monotonic(), 0)
            print(
                f"move: waiting for {n} running tasks to finish (at most {left:.0f} s more)",
                file=out,
                flush=True,
            )
            last = n
        if time.monotonic() >= deadline:
            print(
                f"move: {n} tasks still run at the source after {timeout_s:.0f} s; they "
                "arrive queued (or failed, out of attempts) as lease recovery would leave "
                "them, and may run again on Postgres",
                file=out,
                flush=True,
            )
            return paused
        time.sleep(0.5)


def _plan_lines(plan: Plan) -> list[str]:
    lines = [f"move: from sqlite {plan.source}", f"move: to postgres {plan.target}"]
    if plan.resuming:
        lines.append("move: an earlier run of this move left progress on the target: resuming")
    for table in TABLES:
        n = plan.counts.get(table.name, 0)
        lines.append(f"  {table.name:<26} {n:>10,}  {table.what}")
    for name, why in SKIPPED.items():
        lines.append(f"  {name:<26} {'skipped':>10}  {why}")
    if plan.running:
        lines.append(
            f"move: {plan.running} tasks run at the source: they arrive as lease "
            "recovery leaves them (queued with the attempt counted, or failed)"
        )
    return lines


def cmd_move_to(args: argparse.Namespace) -> int:
    if args.batch < 1:
        raise CliError(exitcodes.USAGE, f"move-to --batch {args.batch}: must be at least 1")
    dsn = _target_dsn(args)
    config = load(args.config)
    path = _source_path(config)
    out = sys.stdout
    try:
        move = Move(
            path,
            dsn,
            batch=args.batch,
            merge=args.merge,
            connect_timeout_s=config.database.connect_timeout.total_seconds(),
        )
    except DatabaseUnavailable as exc:
        raise CliError(exitcodes.UNAVAILABLE, f"move-to: {exc}; nothing was written") from None
    try:
        return _run(move, args, config, out)
    except (ProtocolVersionMismatch, NotACairnqDatabase) as exc:
        raise CliError(exitcodes.DATAERR, f"move-to: {exc}") from None
    except MoveError as exc:
        raise CliError(exitcodes.DATAERR, f"move-to: {exc}") from None
    finally:
        move.close()


def _run(move: Move, args: argparse.Namespace, config: Config, out: IO[str]) -> int:
    plan = move.plan()
    if not args.live and not args.dry_run:
        running = daemons_on(args.config, config.runtime_dir, move)
        if running:
            raise CliError(
                exitcodes.TEMPFAIL,
                "move-to: a daemon runs on the source; stop it first, or give --live to "
                "pause every queue and move while it runs",
                running,
            )
    if not args.dry_run:
        move.refuse_occupied(plan)
    for line in _plan_lines(plan):
        print(line, file=out)
    if args.dry_run:
        if plan.target_tasks and not plan.resuming and not args.merge:
            print(
                f"move: {plan.target} already holds {plan.target_tasks} tasks: the move "
                "would be refused without --merge",
                file=out,
            )
        print("move: dry run; nothing was written", file=out)
        return exitcodes.OK
    paused: list[str] = []
    if args.live:
        paused = pause_and_wait(config, args.live_timeout, out)
    try:
        plan = move.plan()
        view = ProgressView(sys.stderr, sum(plan.counts.values()))
        try:
            results = move.run(view)
        finally:
            view.end()
        print("move: verifying", file=out, flush=True)
        verdict = move.verify(results)
    except BaseException:
        if paused:
            names = " ".join(f"--queue {q}" for q in paused)
            print(
                f"cairnqd: the source's queues stay paused: `cairnqd -c {args.config} "
                f"resume {names}` to carry on there, or run the move again",
                file=sys.stderr,
            )
        raise
    for difference in verdict.differences[:20]:
        print(f"  {difference}", file=out)
    if len(verdict.differences) > 20:
        print(f"  ... and {len(verdict.differences) - 20} more", file=out)
    print(verdict.line(), file=out)
    if args.live:
        names = " ".join(f"--queue {q}" for q in paused) or "--queue Q"
        print(
            "move: the source stays paused (and its pauses moved too, so the target's "
            "queues are paused as well): once the daemons run on Postgres, "
            f"`cairnqd -c NEW.yaml resume {names}`; to go back to SQLite instead, "
            f"`cairnqd -c {args.config} resume {names}`",
            file=out,
        )
    return exitcodes.OK if verdict.ok else exitcodes.DATAERR


def add_parser(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    """Register move-to."""
    p: Any = sub.add_parser(
        "move-to",
        parents=parents,
        help="copy this SQLite database into Postgres, resumable and verified",
        description=(
            "Copy every task (as is; running ones as lease recovery would leave them), "
            "key, attempt record, pause, schedule state, limit and queue counter of the "
            "config's SQLite database into a Postgres database, migrated first. Batches "
            "commit with their progress, so a re-run carries on where one stopped. Ends "
            "by comparing both sides batch by batch. The SQLite file is never written "
            "(except the pauses of --live)."
        ),
    )
    p.add_argument("dsn", nargs="?", metavar="DSN", help="the target: a postgresql:// URL")
    p.add_argument(
        "--to-config",
        metavar="FILE",
        help="take the target from this config's database.dsn instead of DSN",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="move into a database that holds tasks already: ids already there are skipped",
    )
    p.add_argument("--dry-run", action="store_true", help="print what would move; write nothing")
    p.add_argument(
        "--live",
        action="store_true",
        help="while a daemon runs: pause every queue, wait for running tasks, then move; "
        "the source stays paused",
    )
    p.add_argument(
        "--live-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="--live: the longest wait for running tasks (default 300)",
    )
    p.add_argument(
        "--batch",
        type=int,
        default=DEFAULT_BATCH,
        metavar="N",
        help=f"rows per batch and target transaction (default {DEFAULT_BATCH})",
    )
    p.set_defaults(func=cmd_move_to)
