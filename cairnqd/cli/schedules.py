"""`cairnqd schedules`: what each configured schedule does next and did last, and
`cairnqd schedules run NAME`, which enqueues one of its tasks now.

Both read the schedules from the config file and their state from the database (the
scheduler's table), so they answer with or without a daemon running. Times print in
UTC; `--json` gives the same facts for scripts.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cairnqd.cli.admin import CliError, load, with_store
from cairnqd.config import Config, ScheduleConfig
from cairnqd.daemon import exitcodes
from cairnqd.schedules import from_ms
from cairnqd.store.base import TaskStore
from cairnqd.store.tables.schedules import ScheduleRow, ScheduleTable, run_now

if TYPE_CHECKING:
    from cairnqd.cli.admin import Subparsers

__all__ = ["add_parsers"]

_NEXT = 3


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return from_ms(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _next_slots(schedule: ScheduleConfig, row: ScheduleRow | None, now: datetime) -> list[str]:
    if not schedule.enabled:
        return []
    start = now if row is None else max(now, from_ms(row.last_slot_ms))
    return [
        t.isoformat(timespec="seconds").replace("+00:00", "Z")
        for t in schedule.slots().next_n(start, _NEXT)
    ]


def _describe(schedule: ScheduleConfig, row: ScheduleRow | None, now: datetime) -> dict[str, Any]:
    last_run = None
    if row is not None and row.last_fired_at_ms is not None:
        last_run = {
            "at": _iso(row.last_fired_at_ms),
            "slot": _iso(row.last_fired_slot_ms),  # None: a manual run
            "task_id": row.last_task_id,
            "result": row.last_status or "purged",
            "by": row.fired_by,
        }
    last_error = None
    if row is not None and row.last_error is not None:
        last_error = {"at": _iso(row.last_error_at_ms), "message": row.last_error}
    return {
        "schedule": schedule.schedule,
        "task": schedule.name,
        "queue": schedule.queue,
        "rule": schedule.rule,
        "enabled": schedule.enabled,
        "misfire": schedule.misfire.describe(),
        "next": _next_slots(schedule, row, now),
        "last_run": last_run,
        "last_error": last_error,
        "misfires": row.misfires if row is not None else 0,
    }


def _leader(rows: dict[str, ScheduleRow]) -> dict[str, Any] | None:
    seen = [r for r in rows.values() if r.leader is not None and r.leader_seen_at_ms is not None]
    if not seen:
        return None
    newest = max(seen, key=lambda r: r.leader_seen_at_ms or 0)
    return {"host": newest.leader, "seen_at": _iso(newest.leader_seen_at_ms)}


def report(config: Config, rows: dict[str, ScheduleRow], now: datetime) -> dict[str, Any]:
    """What `cairnqd schedules --json` prints."""
    return {
        "leader": _leader(rows),
        "schedules": [_describe(s, rows.get(name), now) for name, s in config.schedules.items()],
    }


def _text(data: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for s in data["schedules"]:
        state = "" if s["enabled"] else "  (disabled)"
        lines.append(
            f"{s['schedule']}: {s['task']} on {s['queue']}, {s['rule']}, "
            f"misfire {s['misfire']}{state}"
        )
        lines.append(f"  next:        {', '.join(s['next']) or '-'}")
        run = s["last_run"]
        if run is None:
            lines.append("  last run:    never")
        else:
            slot = f"slot {run['slot']}" if run["slot"] else "manual"
            lines.append(f"  last run:    {run['at']} ({slot}) by {run['by']}")
            lines.append(f"  last result: {run['result']} (task {run['task_id']})")
        if s["last_error"] is not None:
            error = s["last_error"]
            lines.append(f"  last error:  {error['at']}: {error['message']}")
        if s["misfires"]:
            lines.append(f"  misfires:    {s['misfires']} slot(s) given up")
    leader = data["leader"]
    lines.append(
        f"leader: {leader['host']} (seen {leader['seen_at']})"
        if leader
        else "leader: none seen yet"
    )
    return lines


def check_lines(
    config: Config, registered: dict[str, set[str]] | None
) -> tuple[list[str], list[str]]:
    """For `cairnqd check`: a line per schedule, and, given the task names each group
    registers (`check --handlers`), warnings for a task name that no group of this
    config claiming the queue registers."""
    lines, warnings = [], []
    now = datetime.now(UTC)
    for name, schedule in config.schedules.items():
        upcoming = _next_slots(schedule, None, now)[:1]
        state = f"next {upcoming[0]}" if upcoming else "disabled"
        lines.append(
            f"schedule {name}: {schedule.name} on {schedule.queue}, {schedule.rule}, {state}"
        )
        if registered is not None and not _registered_here(config, schedule, registered):
            warnings.append(
                f"schedule {name}: no group here that claims {schedule.queue!r} registers "
                f"{schedule.name!r}; its tasks wait for a worker elsewhere"
            )
    return lines, warnings


def _registered_here(
    config: Config, schedule: ScheduleConfig, registered: dict[str, set[str]]
) -> bool:
    return any(
        schedule.queue in group.queues and schedule.name in registered.get(group.name, set())
        for group in config.groups.values()
    )


def cmd_schedules(args: argparse.Namespace) -> int:
    config = load(args.config)
    if not config.schedules:
        if args.json:
            print(json.dumps({"leader": None, "schedules": []}, indent=2))
        else:
            print(f"{args.config}: no schedules configured")
        return exitcodes.OK

    async def read(store: TaskStore) -> dict[str, ScheduleRow]:
        return await ScheduleTable(store).rows()

    rows = with_store(config, read)
    data = report(config, rows, datetime.now(UTC))
    if args.json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        print("\n".join(_text(data)))
    return exitcodes.OK


def cmd_schedules_run(args: argparse.Namespace) -> int:
    config = load(args.config)
    schedule = config.schedules.get(args.name)
    if schedule is None:
        known = ", ".join(config.schedules) or "none"
        raise CliError(
            exitcodes.USAGE, f"schedules run: no schedule {args.name!r} in {args.config} "
            f"(configured: {known})"
        )  # fmt: skip
    now_ms = int(time.time() * 1000)

    async def run(store: TaskStore) -> str:
        return await run_now(store, schedule, at_ms=now_ms)

    task_id = with_store(config, run)
    print(f"{task_id} enqueued now for schedule {schedule.schedule} ({schedule.name} on "
          f"{schedule.queue})")  # fmt: skip
    return exitcodes.OK


def add_parsers(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    """Register `schedules` and `schedules run NAME`."""
    p = sub.add_parser(
        "schedules",
        parents=parents,
        help="each schedule's next fire times and last run",
        description="List the config's schedules: the next three fire times, the last "
        "run and its result, misfires, the last error and which host leads the scheduler "
        "(read from the database). `schedules run NAME` enqueues one task of NAME now.",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_schedules)
    actions = p.add_subparsers(dest="schedules_command", metavar="ACTION")
    run = actions.add_parser(
        "run",
        parents=parents,
        help="enqueue one task of NAME now",
        description="Enqueue one task of the schedule NAME now, outside its slots "
        "(a manual trigger); its next slot is unchanged.",
    )
    run.add_argument("name", metavar="NAME", help="the schedule, as named under schedules:")
    run.set_defaults(func=cmd_schedules_run)
