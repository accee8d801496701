"""`cairnqd status`: the running daemon's live state, asked over its control socket.

The daemon answers from memory (`cairnqd/daemon/parent/control.py`): its groups, each
child's pid, generation, uptime, memory, the tasks it is executing and holding and
its longest-running task. The paused queues come from the database, since a pause
belongs to every host rather than to one daemon; when the database cannot be read,
status still shows the daemon and says so.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from cairnqd._jsoncodec import shown_json
from cairnqd.cli.admin import CliError, load, table, with_store
from cairnqd.cli.queues import describe_pause
from cairnqd.config import Config
from cairnqd.config.units import elapsed_text
from cairnqd.daemon import exitcodes
from cairnqd.daemon.parent.control import DaemonUnreachable, Snapshot, ask_daemon, control_path
from cairnqd.daemon.parent.statefile import state_path_of_running
from cairnqd.store.base import TaskStore
from cairnqd.store.operator import QueuePause

if TYPE_CHECKING:
    from cairnqd.cli.admin import Subparsers

#: Shown under every table of held work: what the two counts mean, and why `stats`
#: and `cairnq_tasks{status="running"}` are higher than the executing count.
HELD_NOTE = (
    "executing: handler running (or its result being written); held: claimed ahead "
    "(prefetched), not started yet. Both count as running in `cairnqd stats` and "
    'cairnq_tasks{status="running"}.'
)


def ask(config_path: str, config: Config) -> Snapshot:
    """The daemon's snapshot, or CliError(69) saying why there is none."""
    path = control_path(state_path_of_running(config_path, config.runtime_dir))
    try:
        return ask_daemon(path)
    except DaemonUnreachable as exc:
        raise CliError(
            exitcodes.UNAVAILABLE, f"cannot ask the daemon for {config_path}: {exc}"
        ) from None


def read_pauses(config: Config) -> tuple[list[QueuePause] | None, str | None]:
    """The paused queues, or None and why they could not be read."""

    async def read(store: TaskStore) -> list[QueuePause]:
        return await store.pauses.all()

    try:
        return with_store(config, read), None
    except CliError as exc:
        return None, exc.message


def duration_text(seconds: float) -> str:
    """A short human duration: 42s, 5m03s, 2h05m, 3d04h."""
    return elapsed_text(seconds)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f}MiB"


def _longest(child: dict[str, Any]) -> str:
    longest = child.get("longest")
    if not longest:
        return "-"
    return f"{longest['name']} {duration_text(longest['age_s'])} ({longest['id']})"


def group_lines(group: dict[str, Any]) -> list[str]:
    state = group["state"].upper() if group["state"] == "fatal" else group["state"]
    head = (
        f"group {group['name']}: {state}, {group['ready']}/{group['processes']} ready, "
        f"{group['restarts']} restart{'s' if group['restarts'] != 1 else ''}, "
        f"queues {', '.join(group['queues'])}"
    )
    lines = [head]
    if group.get("fatal_error"):
        lines.append(f"  FATAL: {group['fatal_error']}")
    rows = [
        [
            c["pid"],
            c["slot"]
            if c["role"] == "slot"
            else f"{c['slot']}{'+' if c['role'] == 'successor' else '-'}",
            c["generation"],
            c["state"],
            duration_text(c["uptime_s"]),
            _mib(c["rss"]),
            c["executing"],
            c["held"],
            _longest(c),
        ]
        for c in group["children"]
    ]
    if rows:
        headers = ["PID", "SLOT", "GEN", "STATE", "UPTIME", "RSS", "EXECUTING", "HELD", "LONGEST"]
        lines += ["  " + line for line in table(headers, rows).splitlines()]
    return lines


def status_lines(
    snapshot: Snapshot, pauses: list[QueuePause] | None, note: str | None
) -> list[str]:
    flags = [flag for flag in ("stopping", "quiet") if snapshot.get(flag)]
    lines = [
        f"cairnqd pid {snapshot['pid']}, generation {snapshot['generation']}, "
        f"up {duration_text(snapshot['uptime_s'])}" + (f" ({', '.join(flags)})" if flags else "")
    ]
    if snapshot.get("quiet"):
        lines.append("quiet (SIGTSTP): no child claims until `cairnqd reload`")
    upgrade = snapshot.get("upgrade")
    if isinstance(upgrade, dict):
        groups = upgrade.get("groups", {})
        ready = ", ".join(f"{g} {v['ready']}/{v['of']}" for g, v in groups.items()) or "none yet"
        lines.append(
            f"upgrading: new parent pid {upgrade['pid']} (cairnqd {upgrade['version']}), "
            f"{upgrade['for_s']:g}s in; its groups ready: {ready}"
        )
    if pauses is None:
        lines.append(f"paused queues: unknown ({note})")
    elif pauses:
        lines.append("paused queues (every host):")
        lines += [f"  {describe_pause(p)}" for p in pauses]
    else:
        lines.append("paused queues: none")
    for group in [*snapshot["groups"], *snapshot.get("removed_groups", [])]:
        lines += group_lines(group)
    lines.append(HELD_NOTE)
    return lines


def pause_json(pause: QueuePause) -> dict[str, Any]:
    return {
        "queue": pause.queue,
        "paused_at_ms": pause.paused_at_ms,
        "paused_by": pause.paused_by,
        "reason": pause.reason,
    }


def cmd_status(args: argparse.Namespace) -> int:
    config = load(args.config)
    snapshot = ask(args.config, config)
    pauses, note = read_pauses(config)
    if args.json:
        out = dict(snapshot)
        out["paused_queues"] = None if pauses is None else [pause_json(p) for p in pauses]
        if note is not None:
            out["paused_queues_error"] = note
        print(shown_json(out))  # valid JSON whatever a float holds: no bare Infinity
        return exitcodes.OK
    print("\n".join(status_lines(snapshot, pauses, note)))
    return exitcodes.OK


def add_parsers(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    """Register status."""
    p = sub.add_parser(
        "status",
        parents=parents,
        help="the running daemon's groups, children and paused queues",
        description=(
            "Ask the running daemon (over its control socket in the runtime directory) "
            "for its groups, children and the tasks they run; paused queues come from "
            "the database. Exits 69 when no daemon answers."
        ),
    )
    p.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    p.set_defaults(func=cmd_status)
