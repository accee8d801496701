"""`cairnqd top`: a live view of the daemon and the queues, redrawn every second.

Two sources: the daemon's control socket and the database. Rates are the tasks
submitted and ended in the last `RATE_WINDOW_S`, each counted from an index range of
that window (`TaskStore.recent_counts`), so a purge or a first reading cannot hide them.
`p` pauses a queue, `r` resumes one, `q` quits; without a terminal
it refuses and points at `status --json` (docs/architecture.md, "The command line").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import curses
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cairnqd.cli.admin import CliError, load, open_store, table
from cairnqd.cli.queues import operator_name
from cairnqd.cli.status import HELD_NOTE, duration_text
from cairnqd.config import Config
from cairnqd.daemon import exitcodes
from cairnqd.daemon.parent.control import DaemonUnreachable, Snapshot, ask_daemon, control_path
from cairnqd.daemon.parent.statefile import state_path_of_running
from cairnqd.models import STATUSES, TERMINAL_STATUSES
from cairnqd.store.base import TaskStore

if TYPE_CHECKING:
    from cairnqd.cli.admin import Subparsers

REFRESH_S = 1.0
#: Rates are averages over this many seconds before the reading.
RATE_WINDOW_S = 5
_KEY_WAIT_MS = 100


@dataclass
class QueueView:
    """One queue's line: counts now, and the rates over the last `RATE_WINDOW_S`."""

    counts: dict[str, int]
    submitted_s: float = 0.0
    finished_s: float = 0.0
    failed_s: float = 0.0
    oldest_s: float = 0.0
    paused: bool = False


@dataclass
class Reading:
    """One refresh of everything top shows."""

    at: float
    queues: dict[str, QueueView] = field(default_factory=dict)
    daemon: Snapshot | None = None
    daemon_error: str | None = None
    database_error: str | None = None


async def read_database(store: TaskStore) -> dict[str, QueueView]:
    counts = await store.stats()
    oldest = await store.oldest_queued_age_ms()
    recent = await store.recent_counts(store.now_ms() - RATE_WINDOW_S * 1000)
    paused = {p.queue for p in await store.pauses.all()}
    views: dict[str, QueueView] = {}
    for queue in sorted(set(counts) | paused):
        by_status = counts.get(queue) or dict.fromkeys(STATUSES, 0)
        window = recent.get(queue, {})
        ended = sum(window.get(s, 0) for s in TERMINAL_STATUSES)
        views[queue] = QueueView(
            counts=dict(by_status),
            submitted_s=window.get("submitted", 0) / RATE_WINDOW_S,
            finished_s=ended / RATE_WINDOW_S,
            failed_s=window.get("failed", 0) / RATE_WINDOW_S,
            oldest_s=oldest.get(queue, 0) / 1000,
            paused=queue in paused,
        )
    return views


def queue_lines(reading: Reading) -> list[str]:
    rows = [
        [
            name, v.counts["queued"], v.counts["running"], f"{v.submitted_s:.1f}",
            f"{v.finished_s:.1f}", f"{v.failed_s:.1f}",
            duration_text(v.oldest_s) if v.counts["queued"] else "-",
            "PAUSED" if v.paused else "",
        ]
        for name, v in reading.queues.items()
    ]  # fmt: skip
    headers = ["QUEUE", "QUEUED", "RUNNING", "SUBMIT/s", "FINISH/s", "FAIL/s", "OLDEST", ""]
    return table(headers, rows).splitlines() if rows else ["(no queues yet)"]


def child_lines(snapshot: Snapshot) -> list[str]:
    rows: list[list[Any]] = []
    for group in [*snapshot["groups"], *snapshot.get("removed_groups", [])]:
        state = group["state"].upper() if group["state"] == "fatal" else group["state"]
        rows.append([f"{group['name']} ({state})", "", "", "", "", "", "", ""])
        for c in group["children"]:
            longest = c.get("longest")
            rows.append([
                f"  slot {c['slot']}", c["pid"], c["state"], duration_text(c["uptime_s"]),
                f"{c['rss'] >> 20}MiB", c["executing"], c["held"],
                f"{longest['name']} {duration_text(longest['age_s'])}" if longest else "-",
            ])  # fmt: skip
        if group.get("fatal_error"):
            rows.append([f"  FATAL: {group['fatal_error']}", "", "", "", "", "", "", ""])
    headers = ["GROUP", "PID", "STATE", "UPTIME", "RSS", "EXEC", "HELD", "LONGEST"]
    return table(headers, rows).splitlines()


def screen_lines(reading: Reading, message: str) -> list[str]:
    clock = time.strftime("%H:%M:%S")
    daemon = reading.daemon
    if daemon is not None:
        flags = " quiet" if daemon.get("quiet") else ""
        flags += " stopping" if daemon.get("stopping") else ""
        head = (
            f"cairnqd top  pid {daemon['pid']}  generation {daemon['generation']}  "
            f"up {duration_text(daemon['uptime_s'])}{flags}  {clock}"
        )
    else:
        head = f"cairnqd top  daemon: {reading.daemon_error}  {clock}"
    lines = [head, "keys: p pause a queue  r resume a queue  q quit", ""]
    if reading.database_error:
        lines.append(f"database: {reading.database_error}")
    lines += queue_lines(reading)
    if daemon is not None:
        lines += ["", *child_lines(daemon), "", HELD_NOTE]
    if message:
        lines += ["", message]
    return lines


class Top:
    """The refresh loop and the keys; curses only draws what `screen_lines` says."""

    def __init__(self, config_path: str, config: Config) -> None:
        self.socket = control_path(state_path_of_running(config_path, config.runtime_dir))
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.store = open_store(config)
        self.message = ""

    def close(self) -> None:
        # A store that never connected, or a server gone meanwhile: nothing to keep.
        with contextlib.suppress(Exception):
            self.loop.run_until_complete(self.store.close())
        self.loop.close()

    def read(self) -> Reading:
        reading = Reading(at=time.monotonic())
        try:
            reading.daemon = ask_daemon(self.socket, timeout_s=2.0)
        except DaemonUnreachable as exc:
            reading.daemon_error = str(exc)
        try:
            reading.queues = self.loop.run_until_complete(read_database(self.store))
        except Exception as exc:
            reading.database_error = " ".join(str(exc).split()) or type(exc).__name__
        return reading

    def set_paused(self, queue: str, paused: bool) -> None:
        queue = queue.strip()
        if not queue:
            self.message = "no queue named: nothing done"
            return
        try:
            if paused:
                made = self.loop.run_until_complete(
                    self.store.pauses.pause(
                        [queue], paused_by=operator_name(), reason="paused from cairnqd top"
                    )
                )
                self.message = f"paused {queue}" if made else f"{queue} was paused already"
            else:
                ended = self.loop.run_until_complete(self.store.pauses.resume([queue]))
                self.message = f"resumed {queue}" if ended else f"{queue} was not paused"
        except Exception as exc:  # a bad name or a database error: say it, go on
            self.message = f"cannot change {queue}: {' '.join(str(exc).split())}"

    def run(self, screen: Any) -> None:
        curses.curs_set(0)
        screen.timeout(_KEY_WAIT_MS)
        reading = self.read()
        next_read = time.monotonic() + REFRESH_S
        while True:
            self.draw(screen, reading)
            key = screen.getch()
            if key in (ord("q"), ord("Q")):
                return
            if key in (ord("p"), ord("r")):
                pause = key == ord("p")
                self.set_paused(self.prompt(screen, "pause" if pause else "resume"), pause)
                next_read = 0.0  # show the change at once
            if time.monotonic() >= next_read:
                reading = self.read()
                next_read = time.monotonic() + REFRESH_S

    def prompt(self, screen: Any, verb: str) -> str:
        height, width = screen.getmaxyx()
        question = f"{verb} queue: "
        screen.move(height - 1, 0)
        screen.clrtoeol()
        screen.addnstr(height - 1, 0, question, width - 1)
        curses.echo()
        curses.curs_set(1)
        screen.timeout(-1)
        try:
            room = max(1, min(255, width - len(question) - 1))
            raw = screen.getstr(height - 1, min(len(question), width - 1), room)
        except curses.error:  # a terminal too small to ask in
            raw = b""
        finally:
            curses.noecho()
            curses.curs_set(0)
            screen.timeout(_KEY_WAIT_MS)
        return bytes(raw).decode(errors="replace")

    def draw(self, screen: Any, reading: Reading) -> None:
        height, width = screen.getmaxyx()
        screen.erase()
        for row, line in enumerate(screen_lines(reading, self.message)[: height - 1]):
            with contextlib.suppress(curses.error):  # a terminal shrunk mid-draw
                screen.addnstr(row, 0, line, max(1, width - 1))
        screen.refresh()


def cmd_top(args: argparse.Namespace) -> int:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise CliError(
            exitcodes.USAGE, "top needs a terminal; for scripts use `cairnqd status --json`"
        )
    config = load(args.config)
    top = Top(args.config, config)
    try:
        curses.wrapper(top.run)
    finally:
        top.close()
    return exitcodes.OK


def add_parsers(sub: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    """Register top."""
    p = sub.add_parser(
        "top",
        parents=parents,
        help="live view of the daemon and the queues; p/r pause/resume, q quits",
        description=(
            "Redraws every second: the daemon's groups and children (as `status`) and, "
            "per queue, queued and running counts, submitted/finished/failed per second, "
            "and the oldest queued task's age. Keys: p pause a queue, r resume one, q quit."
        ),
    )
    p.set_defaults(func=cmd_top)
