"""`cairnqd pause` and `cairnqd resume`: stop and restart claiming from a queue on
every host that shares the database.

A pause is a row in cairnqd's own table (`cairnqd/store/operator.py`), honoured by every
daemon child within a second (docs/architecture.md, "Queue pauses").
"""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
from typing import TYPE_CHECKING, Any

from cairnqd.cli.admin import CliError, load, with_store
from cairnqd.cli.argtypes import text
from cairnqd.cli.fleet import warn_unhonoured
from cairnqd.cli.listing import clock
from cairnqd.daemon import exitcodes
from cairnqd.store.base import TaskStore
from cairnqd.store.operator import QueuePause

if TYPE_CHECKING:
    from cairnqd.cli.admin import Subparsers


def operator_name() -> str:
    """Who paused: the login and the host, as an operator would write it."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def since(ms: int) -> str:
    """An epoch-ms time as UTC, to the second, from the integer (exact)."""
    return clock(ms)


def describe_pause(pause: QueuePause) -> str:
    why = f": {pause.reason}" if pause.reason else ""
    return f"{pause.queue} (paused {since(pause.paused_at_ms)} by {pause.paused_by}{why})"


def _check_queues(command: str, queues: list[str] | None) -> list[str]:
    if not queues:
        raise CliError(exitcodes.USAGE, f"{command}: name at least one queue with --queue Q")
    for queue in queues:
        if not queue or len(queue) > 255:
            raise CliError(exitcodes.USAGE, f"{command}: --queue {queue!r}: 1 to 255 characters")
    return list(dict.fromkeys(queues))


async def _warn_unknown(store: TaskStore, queues: list[str], source: str | None) -> None:
    """A queue no group of the config claims and no task names is most likely a typo:
    say so (it is paused all the same: a queue may be paused before its first task)."""
    for queue in queues:
        if not any((await store.stats(queue)).get(queue, {}).values()):
            print(
                f"cairnqd: warning: queue {queue!r} is claimed by no group in "
                f"{source or 'the config'} and holds no task: is the name right? "
                "(paused anyway)",
                file=sys.stderr,
            )


async def _pause(
    store: TaskStore, queues: list[str], reason: str | None, *, strict: bool
) -> tuple[list[QueuePause], list[QueuePause]]:
    # A pause works only where every daemon honours it: say which would not, first.
    warn_unhonoured(await store.fleet.live(), "pauses", "pause", strict=strict)
    made = await store.pauses.pause(queues, paused_by=operator_name(), reason=reason)
    current = {p.queue: p for p in await store.pauses.all()}
    earlier = [current[q] for q in queues if q in current and q not in {m.queue for m in made}]
    return made, earlier


def cmd_pause(args: argparse.Namespace) -> int:
    queues = _check_queues("pause", args.queue)
    if args.reason is not None and len(args.reason) > 1000:
        raise CliError(exitcodes.USAGE, "pause: --reason: at most 1000 characters")
    config = load(args.config)
    claimed = {q for g in config.groups.values() for q in g.queues}

    async def act(store: TaskStore) -> tuple[list[QueuePause], list[QueuePause]]:
        await _warn_unknown(store, [q for q in queues if q not in claimed], config.source)
        return await _pause(store, queues, args.reason, strict=args.strict)

    made, earlier = with_store(config, act)
    for pause in made:
        print(f"paused {describe_pause(pause)}")
    for pause in earlier:
        print(f"already paused: {describe_pause(pause)}")
    if not made:  # docs/operations.md, section 7: no state change exits 1, as resume's
        raise CliError(
            exitcodes.NOTHING_DONE, f"nothing paused: already paused: {', '.join(queues)}"
        )
    return exitcodes.OK


def cmd_resume(args: argparse.Namespace) -> int:
    queues = _check_queues("resume", args.queue)

    async def resume(store: TaskStore) -> list[QueuePause]:
        return await store.pauses.resume(queues)

    ended = with_store(load(args.config), resume)
    for pause in ended:
        print(f"resumed {pause.queue} (paused since {since(pause.paused_at_ms)})")
    missing = [q for q in queues if q not in {p.queue for p in ended}]
    if missing:
        raise CliError(exitcodes.NOTHING_DONE, f"not paused: {', '.join(missing)}")
    return exitcodes.OK


def add_parsers(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    """Register pause and resume."""
    p: Any = sub.add_parser(
        "pause",
        parents=parents,
        help="stop claiming from queues on every host (until resume)",
        description=(
            "Pause queues in the database: every daemon child, on every host, stops "
            "claiming from them within a second. Tasks already held still run. Exits 1 "
            "when every queue named was already paused (nothing changed)."
        ),
    )
    p.add_argument(
        "--queue", action="append", type=text, metavar="Q", help="a queue to pause (repeatable)"
    )
    p.add_argument(
        "--reason", type=text, metavar="TEXT", help="why, shown by status, stats and top"
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse (exit 1) when a live daemon does not honour pauses (`cairnqd fleet`)",
    )
    p.set_defaults(func=cmd_pause)

    p = sub.add_parser(
        "resume",
        parents=parents,
        help="resume claiming from paused queues",
        description="Resume paused queues; exits 1 if one of them was not paused.",
    )
    p.add_argument(
        "--queue", action="append", type=text, metavar="Q", help="a queue to resume (repeatable)"
    )
    p.set_defaults(func=cmd_resume)
