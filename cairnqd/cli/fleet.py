"""`cairnqd fleet`: the daemons live on this database, their versions and the features
each honours (store/tables/fleet.py); and the check every fleet-wide action makes
before it acts (`warn_unhonoured`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cairnqd.cli.admin import CliError, load, with_store
from cairnqd.daemon import exitcodes
from cairnqd.store.base import TaskStore
from cairnqd.store.tables.fleet import FleetMember, lacking, versions

if TYPE_CHECKING:
    from cairnqd.cli.admin import Subparsers


def _age(ms: int) -> str:
    seconds = max(0, ms) // 1000
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def fleet_lines(members: Sequence[FleetMember]) -> list[str]:
    """The table `fleet` prints (and `check --connect` and `migrate`): one daemon per
    line, then a line on mixed versions when there are several."""
    live = [m for m in members if m.live]
    if not live:
        return ["no daemon is live on this database"]
    rows = [("DAEMON", "VERSION", "PIPE", "SEEN", "GROUPS", "FEATURES")]
    for m in live:
        rows.append(
            (
                m.daemon,
                m.version,
                str(m.pipe_protocol),
                f"{_age(m.age_ms)} ago",
                ",".join(m.groups) or "-",
                ",".join(m.features) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    ]
    by_version = versions(live)
    if len(by_version) > 1:
        mix = ", ".join(f"{v} ({n})" for v, n in by_version.items())
        lines.append(f"mixed versions: {mix}")
    return lines


def warn_unhonoured(
    members: Sequence[FleetMember], feature: str, action: str, *, strict: bool
) -> None:
    """Before an action that needs every daemon's cooperation: name the live daemons
    that do not honour `feature` on stderr; with `strict`, refuse (exit 1)."""
    ignoring = lacking(members, feature)
    if not ignoring:
        return
    named = ", ".join(f"{m.daemon} ({m.version})" for m in ignoring)
    if strict:
        raise CliError(
            exitcodes.NOTHING_DONE,
            f"{action}: refused (--strict): {len(ignoring)} live daemon(s) do not honour "
            f"{feature}: {named}",
        )
    print(
        f"warning: {len(ignoring)} live daemon(s) do not honour {feature} and will "
        f"ignore this: {named}",
        file=sys.stderr,
    )


def cmd_fleet(args: argparse.Namespace) -> int:
    if args.since < 0:
        raise CliError(exitcodes.USAGE, f"fleet: --since {args.since}: must be 0 or more")

    async def read(store: TaskStore) -> list[FleetMember]:
        return await store.fleet.members(since_ms=args.since * 1000)

    members = with_store(load(args.config), read)
    if args.json:
        live = [m for m in members if m.live]
        out: dict[str, Any] = {
            "daemons": [m.to_json() for m in members if m.live or args.all],
            "versions": versions(live),
            "mixed_versions": len(versions(live)) > 1,
        }
        print(json.dumps(out, indent=2))
        return exitcodes.OK
    for line in fleet_lines(members):
        print(line)
    if args.all:
        gone = [m for m in members if not m.live]
        for m in gone:
            state = "stopped" if m.stopped_at_ms is not None else "silent"
            print(f"{state}: {m.daemon} ({m.version}), last seen {_age(m.age_ms)} ago")
    return exitcodes.OK


def add_parser(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    """Register fleet."""
    p: Any = sub.add_parser(
        "fleet",
        parents=parents,
        help="the daemons live on this database, their versions and features",
        description=(
            "List the daemons that run on this database, from every host: version, pipe "
            "protocol, groups and the fleet-wide features each honours. A daemon counts "
            "as live while it stamps its row (every 5 s; gone after 20 s of silence)."
        ),
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--all", action="store_true", help="also list daemons stopped or silent within --since"
    )
    p.add_argument(
        "--since",
        type=int,
        default=3600,
        metavar="SECONDS",
        help="how far back --all looks (default 3600)",
    )
    p.set_defaults(func=cmd_fleet)
