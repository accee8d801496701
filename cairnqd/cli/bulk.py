"""`cairnqd cancel` and `cairnqd retry` by filter: many tasks at once, safely.

Filters count first (`--dry-run` stops there) and act only with `--yes` or a "y" on a
terminal, `BULK_BATCH` ids per transaction with the protocol's own statements
(docs/architecture.md, "The command line").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cairnqd.cli.admin import CliError, load, with_store
from cairnqd.cli.argtypes import duration, text
from cairnqd.config import Config, format_duration, to_ms
from cairnqd.daemon import exitcodes
from cairnqd.store.base import wall_clock_ms
from cairnqd.store.operator import TaskFilter

if TYPE_CHECKING:
    from cairnqd.cli.admin import Subparsers

_FILTERS = ("status", "queue", "name", "since", "older_than")


@dataclass(frozen=True)
class BulkAction:
    """What one command does to the tasks it matches."""

    command: str  # cancel, retry
    verb: str  # past tense, for the report
    statuses: tuple[str, ...]  # what it can change; the default --status


ACTIONS = {
    "cancel": BulkAction("cancel", "canceled", ("queued", "running")),
    "retry": BulkAction("retry", "requeued", ("failed", "canceled")),
}


def _wanted(args: argparse.Namespace) -> bool:
    return any(getattr(args, f, None) is not None for f in _FILTERS)


def task_filter(args: argparse.Namespace, action: BulkAction, now_ms: int) -> TaskFilter:
    statuses = tuple(args.status) if args.status else action.statuses
    return TaskFilter(
        statuses=tuple(dict.fromkeys(statuses)),
        queue=args.queue,
        name=args.name,
        created_after_ms=None if args.since is None else now_ms - to_ms(args.since),
        created_before_ms=None if args.older_than is None else now_ms - to_ms(args.older_than),
    )


def describe(args: argparse.Namespace, where: TaskFilter) -> str:
    parts = [f"status {'/'.join(where.statuses)}"]
    if where.queue is not None:
        parts.append(f"queue {where.queue}")
    if where.name is not None:
        parts.append(f"name {where.name}")
    if args.since is not None:
        parts.append(f"created in the last {format_duration(args.since)}")
    if args.older_than is not None:
        parts.append(f"created more than {format_duration(args.older_than)} ago")
    return ", ".join(parts)


def _confirm(action: BulkAction, count: int, described: str, assume_yes: bool) -> None:
    if assume_yes:
        return
    question = f"{action.command} {count} task(s) ({described})?"
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise CliError(
            exitcodes.USAGE,
            f"{action.command}: would {question[:-1]}; pass --yes to do it "
            "(or --dry-run to only count)",
        )
    answer = input(f"{question} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise CliError(exitcodes.NOTHING_DONE, f"{action.command}: nothing done")


def run_bulk(args: argparse.Namespace, action: BulkAction) -> int:
    if getattr(args, "task_id", None) is not None or getattr(args, "key", None) is not None:
        raise CliError(
            exitcodes.USAGE,
            f"{action.command}: give a TASK_ID, --key or filters (--status, --queue, --name, "
            "--since, --older-than), not both",
        )
    if not _wanted(args):
        # Everything at once must be asked for: `--status queued` is a filter too.
        raise CliError(
            exitcodes.USAGE,
            f"{action.command}: --dry-run and --yes need at least one filter "
            "(--status, --queue, --name, --since, --older-than)",
        )
    for status in args.status or ():
        if status not in action.statuses:
            allowed = ", ".join(action.statuses)
            raise CliError(
                exitcodes.USAGE, f"{action.command}: --status {status}: only {allowed} tasks"
            )
    config: Config = load(args.config)
    where = task_filter(args, action, wall_clock_ms())
    described = describe(args, where)
    count = with_store(config, lambda store: store.bulk.count(where))
    if args.dry_run or count == 0:
        print(f"would {action.command} {count} task(s): {described}")
        return exitcodes.OK
    _confirm(action, count, described, args.yes)
    reset = bool(getattr(args, "reset_attempt", False))
    done = with_store(
        config, lambda store: store.bulk.apply(action.command, where, reset_attempt=reset)
    )
    matched, changed, requested = done.matched, done.changed, done.requested
    line = f"{action.verb} {changed} task(s): {described}"
    if requested:
        line += f" ({requested} running: cancel requested, their handlers settle them)"
    if matched > changed:
        line += f"; {matched - changed} changed status meanwhile and were left alone"
    print(line)
    return exitcodes.OK


def _wrap(action: BulkAction, single: Callable[[argparse.Namespace], int]) -> Any:
    def command(args: argparse.Namespace) -> int:
        if _wanted(args) or args.dry_run or args.yes:
            return run_bulk(args, action)
        return single(args)

    return command


def extend_parsers(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    """Give the existing `cancel` and `retry` commands their filter forms (registered
    after them; `parents` is unused: the options join parsers that already have them)."""
    del parents
    for name, action in ACTIONS.items():
        parser = sub.choices[name]
        group = parser.add_argument_group(
            "bulk (instead of TASK_ID or --key)",
            f"{name} every matching task; --status defaults to {' and '.join(action.statuses)}",
        )
        group.add_argument(
            "--status",
            action="append",
            choices=action.statuses,
            help="only tasks in this status (repeatable)",
        )
        group.add_argument("--queue", type=text, help="only tasks in this queue")
        group.add_argument("--name", type=text, help="only tasks of this task name")
        group.add_argument(
            "--since", type=duration, metavar="DURATION", help="only tasks created within it"
        )
        group.add_argument(
            "--older-than", type=duration, metavar="DURATION", help="only tasks created before it"
        )
        group.add_argument("--dry-run", action="store_true", help="only count the matching tasks")
        group.add_argument("--yes", action="store_true", help="do it without asking")
        parser.set_defaults(func=_wrap(action, parser.get_default("func")))
