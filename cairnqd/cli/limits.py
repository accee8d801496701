"""`cairnqd limits`: each flow-control limit of the config and what it holds now;
`limits set` changes one for every host until the next reload, `limits reset` drops
that change (docs/limits.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from cairnqd.cli.admin import CliError, load, with_store
from cairnqd.cli.argtypes import text
from cairnqd.cli.fleet import warn_unhonoured
from cairnqd.cli.queues import operator_name, since
from cairnqd.config import Config
from cairnqd.config.units import format_duration
from cairnqd.daemon import exitcodes
from cairnqd.limits import MAX_CAPACITY, Limit, Override, Rate, overridden, parse_rate
from cairnqd.store.base import TaskStore
from cairnqd.store.tables.limits import Bypass, LimitUsage

if TYPE_CHECKING:
    from cairnqd.cli.admin import Subparsers


def _ms(ms: int) -> str:
    return format_duration(timedelta(milliseconds=ms))


def usage_lines(usages: list[LimitUsage], overrides: dict[str, Override]) -> list[str]:
    """The table `cairnqd limits` prints: a line per limit, one per busy partition."""
    if not usages:
        return ["no limits in the config (see docs/limits.md)"]
    rows = [("LIMIT", "PARTITION", "RUNNING", "STARTS", "WAITING", "WINDOW OPENS IN")]
    notes = []
    for usage in usages:
        lim = usage.limit
        cap = "" if lim.concurrency is None else f"/{lim.concurrency}"
        per = "" if lim.rate is None else f"/{lim.rate.count} per {_ms(lim.rate.window_ms)}"
        parts = usage.partitions or ()
        if lim.partition_by is None or not parts:
            starts = sum(p.starts for p in parts)
            opens = [p.window_frees_in_ms for p in parts if p.window_frees_in_ms is not None]
            rows.append(
                (
                    lim.name,
                    "-" if lim.partition_by is None else f"(by {lim.partition_field})",
                    f"{usage.in_use}{cap}" if lim.concurrency is not None else "-",
                    f"{starts}{per}" if lim.rate is not None else "-",
                    str(usage.waiting),
                    _ms(min(opens)) if opens and lim.rate and starts >= lim.rate.count else "-",
                )
            )
        else:
            for p in parts:
                full = lim.rate is not None and p.starts >= lim.rate.count
                rows.append(
                    (
                        lim.name,
                        p.part,
                        f"{p.in_use}{cap}" if lim.concurrency is not None else "-",
                        f"{p.starts}{per}" if lim.rate is not None else "-",
                        str(p.waiting),
                        _ms(p.window_frees_in_ms or 0) if full else "-",
                    )
                )
        o = overrides.get(lim.name)
        if o is not None:
            why = f": {o.reason}" if o.reason else ""
            at = since(o.set_at_ms)
            notes.append(f"{lim.name}: set by {o.set_by} at {at}{why} (until the next reload)")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return lines + notes


def cmd_limits(args: argparse.Namespace) -> int:
    config = load(args.config)
    limits = config.flow_limits()

    async def read(
        store: TaskStore,
    ) -> tuple[list[LimitUsage], dict[str, Override], list[Bypass]]:
        table = store.limit_table
        overrides = {o.name: o for o in await table.overrides()}
        kept = overridden(limits, overrides.values())
        return await table.usage(kept), overrides, await table.bypassing(kept)

    usages, overrides, bypasses = with_store(config, read)
    for bypass in bypasses:
        print(f"warning: {bypass.describe()}", file=sys.stderr)
    if args.json:
        out = []
        for usage in usages:
            entry = usage.to_json()
            o = overrides.get(usage.limit.name)
            entry["override"] = None if o is None else dataclasses.asdict(o)
            out.append(entry)
        print(json.dumps({"limits": out}, indent=2))
        return exitcodes.OK
    for line in usage_lines(usages, overrides):
        print(line)
    return exitcodes.OK


def _known(config: Config, name: str, command: str) -> Limit:
    for limit in config.flow_limits():
        if limit.name == name:
            return limit
    names = ", ".join(config.limits) or "none"
    raise CliError(
        exitcodes.USAGE,
        f"limits {command}: no limit {name!r} in {config.source or 'the config'} "
        f"(its limits: {names})",
    )


def cmd_limits_set(args: argparse.Namespace) -> int:
    config = load(args.config)
    limit = _known(config, args.name, "set")
    concurrency: int | None = args.concurrency
    rate: Rate | None = None
    if concurrency is None and args.rate is None:
        raise CliError(
            exitcodes.USAGE, "limits set: give --concurrency N, --rate N/DURATION, or both"
        )
    if concurrency is not None:
        if not 1 <= concurrency <= MAX_CAPACITY:
            raise CliError(
                exitcodes.USAGE, f"limits set: --concurrency {concurrency}: 1 to {MAX_CAPACITY}"
            )
        if limit.concurrency is None:
            raise CliError(
                exitcodes.USAGE,
                f"limits set: {limit.name} has no concurrency in the config; only a value "
                "the config sets can be changed here",
            )
    if args.rate is not None:
        try:
            rate = parse_rate(args.rate, "--rate")
        except ValueError as exc:
            raise CliError(exitcodes.USAGE, f"limits set: {exc}") from None
        if limit.rate is None:
            raise CliError(
                exitcodes.USAGE,
                f"limits set: {limit.name} has no rate in the config; only a value the "
                "config sets can be changed here",
            )
    if args.reason is not None and len(args.reason) > 1000:
        raise CliError(exitcodes.USAGE, "limits set: --reason: at most 1000 characters")

    async def act(store: TaskStore) -> Override:
        warn_unhonoured(await store.fleet.live(), "limits", "limits set", strict=args.strict)
        return await store.limit_table.set(
            limit.name,
            concurrency=concurrency,
            rate=rate,
            set_by=operator_name(),
            reason=args.reason,
        )

    made = with_store(config, act)
    changes = []
    if made.concurrency is not None:
        changes.append(f"concurrency {limit.concurrency} -> {made.concurrency}")
    if made.rate is not None and limit.rate is not None:
        changes.append(
            f"rate {limit.rate.count}/{_ms(limit.rate.window_ms)} -> "
            f"{made.rate.count}/{_ms(made.rate.window_ms)}"
        )
    print(
        f"limit {limit.name}: {', '.join(changes)} on every host within a second, "
        "until the next reload of the config (or limits reset)"
    )
    return exitcodes.OK


def cmd_limits_reset(args: argparse.Namespace) -> int:
    config = load(args.config)
    names = [_known(config, n, "reset").name for n in args.name]

    async def act(store: TaskStore) -> list[str]:
        return await store.limit_table.clear(names)

    dropped = with_store(config, act)
    for name in dropped:
        print(f"limit {name}: back to the config")
    missing = [n for n in names if n not in dropped]
    if missing:
        raise CliError(exitcodes.NOTHING_DONE, f"not overridden: {', '.join(missing)}")
    return exitcodes.OK


def add_parser(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    """Register limits (with its set and reset)."""
    p: Any = sub.add_parser(
        "limits",
        parents=parents,
        help="flow-control limits: what each holds now; set or reset one for every host",
        description=(
            "Each limit of the config with what it holds now: tasks running under it "
            "(concurrency), starts in the current window (rate), due tasks it covers that "
            "wait, and when a full window opens again; a partitioned limit shows each busy "
            "partition. `limits set` and `limits reset` change a limit on every host."
        ),
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_limits)
    actions = p.add_subparsers(dest="limits_action", metavar="{set,reset}")
    s: Any = actions.add_parser(
        "set",
        parents=parents,
        help="change a limit on every host until the next reload",
        description=(
            "Change a limit's concurrency or rate for every worker on the database, "
            "within a second; a reload of the config (on any host) goes back to the file. "
            "Lowering it lets running tasks finish and starts none of its tasks until "
            "fewer run than the new value."
        ),
    )
    s.add_argument("name", type=text, help="the limit's name in the config")
    s.add_argument(
        "--concurrency", type=int, metavar="N", help="at most N of its tasks running at once"
    )
    s.add_argument("--rate", metavar="N/DURATION", help="e.g. 50/10s")
    s.add_argument("--reason", type=text, metavar="TEXT", help="why, shown by `cairnqd limits`")
    s.add_argument(
        "--strict",
        action="store_true",
        help="refuse (exit 1) when a live daemon does not honour limits (`cairnqd fleet`)",
    )
    s.set_defaults(func=cmd_limits_set)
    r: Any = actions.add_parser(
        "reset",
        parents=parents,
        help="drop a change made with limits set",
        description="Go back to the config's values; exits 1 if a limit had no change.",
    )
    r.add_argument("name", nargs="+", type=text, help="the limits' names")
    r.set_defaults(func=cmd_limits_reset)
