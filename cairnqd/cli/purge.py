"""`cairnqd purge`: delete finished tasks, by the configured rules or by explicit filters.

Bare, it runs `retention.rules` as the daemon's sweep does, each rule to the end; explicit
filters delete only after `--yes` or a yes on a terminal (else exit 64); `--dry-run`
counts per rule (docs/architecture.md, "The command line").
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from cairnqd.cli.admin import CliError, load, with_store
from cairnqd.cli.argtypes import bounded_duration, integer, text
from cairnqd.config import Config, PurgeRule, to_ms
from cairnqd.config.bounds import MAX_PURGE_BATCH
from cairnqd.daemon import exitcodes
from cairnqd.models import TERMINAL_STATUSES

if TYPE_CHECKING:
    from cairnqd.cli.admin import Subparsers
    from cairnqd.store.base import TaskStore

__all__ = ["add_parser", "cmd_purge"]


def _filters_given(args: argparse.Namespace) -> bool:
    return any(v is not None for v in (args.older_than, args.status, args.queue, args.name))


def _explicit_rule(args: argparse.Namespace) -> PurgeRule:
    return PurgeRule(args.older_than or timedelta(0), args.status, args.queue, args.name)


async def _counts(store: TaskStore, rules: Sequence[PurgeRule]) -> list[int]:
    return [
        await store.count_purgeable(
            older_than_ms=to_ms(rule.older_than),
            status=rule.status,
            queue=rule.queue,
            name=rule.name,
        )
        for rule in rules
    ]


async def _drain(store: TaskStore, rule: PurgeRule, batch: int) -> int:
    deleted = 0
    while True:
        ids = await store.purge(
            older_than_ms=to_ms(rule.older_than),
            status=rule.status,
            queue=rule.queue,
            name=rule.name,
            limit=batch,
        )
        deleted += len(ids)
        if len(ids) < batch:
            return deleted
        # SQLite has one writer: the pause lets the workers' commits in between.
        await asyncio.sleep(store.purge_batch_pause_s)


async def _sweep(
    store: TaskStore, rules: Sequence[PurgeRule], batch: int, lock_namespace: int
) -> list[int] | None:
    """Each rule drained in order under the daemon's purge lock; None if another
    host holds it."""
    from cairnqd.daemon.parent.purge import PURGE_LOCK_ID  # the daemon's own lock

    async with store.leadership.exclusive(lock_namespace, PURGE_LOCK_ID) as held:
        if not held:
            return None
        deleted = [await _drain(store, rule, batch) for rule in rules]
        if sum(deleted):
            await store.after_purge(wait=True)
        return deleted


def _confirm(count: int, rule: PurgeRule) -> bool:
    """Ask on the terminal; only called when stdin is one."""
    print(f"delete {count} task(s): {rule.describe()}? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def _print_rules(rules: Sequence[PurgeRule], counts: Sequence[int], verb: str) -> None:
    for index, (rule, count) in enumerate(zip(rules, counts, strict=True), 1):
        print(f"rule {index}: {rule.describe()}: {verb} {count}")


def cmd_purge(args: argparse.Namespace) -> int:
    config = load(args.config)
    batch = args.limit or config.retention.batch
    if _filters_given(args):
        return _purge_filtered(args, config, _explicit_rule(args), batch)
    rules = config.retention.rules
    if not rules:
        print(
            "retention.rules is empty: the configured rules delete nothing "
            "(give --older-than, --status, --queue or --name to delete anyway)"
        )
        return exitcodes.OK
    if args.dry_run:
        counts = with_store(config, lambda store: _counts(store, rules))
        _print_rules(rules, counts, "would delete")
        overlap = " (a task two rules match is counted twice)" if len(rules) > 1 else ""
        print(f"would delete up to {sum(counts)} task(s) by retention.rules{overlap}")
        return exitcodes.OK
    namespace = config.database.lock_namespace
    deleted = with_store(config, lambda store: _sweep(store, rules, batch, namespace))
    if deleted is None:
        raise _lock_held()
    _print_rules(rules, deleted, "deleted")
    print(f"deleted {sum(deleted)} task(s) by retention.rules")
    return exitcodes.OK


def _purge_filtered(args: argparse.Namespace, config: Config, rule: PurgeRule, batch: int) -> int:
    count = with_store(config, lambda store: _counts(store, [rule]))[0]
    if args.dry_run:
        print(f"would delete {count} task(s): {rule.describe()}")
        return exitcodes.OK
    if count and not args.yes:
        if not sys.stdin.isatty():
            raise CliError(
                exitcodes.USAGE,
                f"purge: would delete {count} task(s): {rule.describe()}, beyond the configured "
                "retention.rules; add --yes to delete them (or --dry-run to count)",
            )
        if not _confirm(count, rule):
            print("nothing deleted")
            return exitcodes.NOTHING_DONE
    namespace = config.database.lock_namespace
    deleted = with_store(config, lambda store: _sweep(store, [rule], batch, namespace))
    if deleted is None:
        raise _lock_held()
    print(f"deleted {deleted[0]} task(s): {rule.describe()}")
    return exitcodes.OK


def _lock_held() -> CliError:
    return CliError(
        exitcodes.TEMPFAIL,
        "purge: another host is purging this database right now; try again in a moment",
    )


# `cairnqd purge --help` describes the command in full.
_DESCRIPTION = """\
A bare `purge` does what the daemon's purge scheduler does on its next
sweep: every rule in `retention.rules`, in order, in batches of `retention.batch`
with the store's pause between batches, under the same purge lock (so it never runs
beside a daemon's sweep on Postgres). The one difference is that each rule is drained
to the end instead of stopping after `retention.max_batches`: an operator who asks for
a purge wants it finished. With no rules configured it deletes nothing.

Anything wider is explicit: `--older-than`, `--status`, `--queue` or `--name` make one
rule of their own, which deletes only after `--yes`, or after a yes at a prompt when
stdin is a terminal; without either it refuses (exit 64) and says how many tasks it
would have deleted. `--dry-run` counts, per rule, and deletes nothing.
"""


def add_parser(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "purge",
        parents=parents,
        help="delete finished tasks by the configured retention rules (or explicit filters)",
        description=_DESCRIPTION,
        epilog="examples:\n"
        "  cairnqd purge --dry-run            count what retention.rules would delete\n"
        "  cairnqd purge                      apply retention.rules now\n"
        "  cairnqd purge --status failed --older-than 1d --yes",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    filters = p.add_argument_group("explicit filters (need --yes, or a yes at the prompt)")
    filters.add_argument(
        "--older-than",
        # The store's longest: past it, every count and delete would fail.
        type=bounded_duration(),
        metavar="DURATION",
        help="only tasks finished longer ago than this (default with other filters: 0s)",
    )
    filters.add_argument(
        "--status", choices=sorted(TERMINAL_STATUSES), help="only tasks that ended so"
    )
    filters.add_argument("--queue", type=text, help="only this queue")
    filters.add_argument("--name", type=text, help="only this task name")
    p.add_argument("--yes", action="store_true", help="delete by explicit filters without asking")
    p.add_argument(
        "--limit",
        # retention.batch's own range: the setting this stands in for.
        type=integer(1, MAX_PURGE_BATCH),
        metavar="N",
        help="rows per delete transaction (default: retention.batch)",
    )
    p.add_argument("--dry-run", action="store_true", help="only count, per rule")
    p.set_defaults(func=cmd_purge)
