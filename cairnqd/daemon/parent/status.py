"""What the parent says about itself: its process title, systemd READY and WATCHDOG,
`/healthz`, and the status dump SIGUSR1 logs."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from setproctitle import setproctitle

from cairnqd.daemon import systemd
from cairnqd.daemon.parent.cadence import Due
from cairnqd.daemon.parent.pool import ChildProcess, GroupPool
from cairnqd.daemon.wire.messages import STALL_WARN_S

#: `/healthz` fails once the loop has not ticked for this long (it ticks at least
#: every `cadence.IDLE_TICK_S`, 1 s).
_STALE_LOOP_S = 5.0
#: A write refused for want of space keeps /healthz unhealthy this long: a full disk
#: fails writes only when there are some to make, so a quiet spell proves nothing.
FULL_RECENT_S = 30.0
#: Before READY, while children wait for the database, ask systemd for this much more
#: start time every `_EXTEND_EVERY_S`: an outage at boot is waited out, not a failed start.
_EXTEND_BY_S = 30.0
_EXTEND_EVERY_S = 10.0


@dataclass(frozen=True)
class GroupHealth:
    state: str  # running, crashloop, fatal
    error: str | None
    ready: int
    desired: int


class StatusReport:
    """`tick()` runs once per tick of the supervisor's loop; `health()` answers
    `/healthz` from the metrics server's threads, from what the last tick saw (a
    snapshot replaced whole, so a scrape never sees a pool half-updated)."""

    def __init__(self, config_path: str, database_problems: Callable[[], list[str]] = list) -> None:
        self._config_path = config_path
        self._database_problems = database_problems
        self._groups: dict[str, GroupHealth] = {}
        # How long each child that cannot reach the database has been failing.
        self._children_db_down: tuple[float, ...] = ()
        # How long ago each child last had a write refused for want of space (recent ones).
        self._children_full_ago: tuple[float, ...] = ()
        # Per group: how long its stalled children's database calls made no progress.
        self._stalled: dict[str, tuple[float, ...]] = {}
        self._stopping = False
        self._title = ""
        self.ready_sent = False
        self.last_tick = time.monotonic()
        self.watchdog_every = systemd.watchdog_interval()
        self.last_watchdog = 0.0
        self.last_extend = 0.0
        #: Said after the process title's counts: a binary upgrade under way.
        self.note = ""

    def tick(
        self,
        groups: Collection[GroupPool],
        children: Iterable[ChildProcess],
        *,
        generation: int,
        stopping: bool,
    ) -> None:
        now = time.monotonic()
        self.last_tick = now
        self._groups = {g.name: _group_health(g) for g in groups}
        self._stopping = stopping
        children = list(children)
        self._children_db_down = tuple(c.db_down_s for c in children if c.db_down_s > 0)
        self._children_full_ago = tuple(
            now - c.full_at
            for c in children
            if c.full_at is not None and now - c.full_at < FULL_RECENT_S
        )
        stalled: dict[str, tuple[float, ...]] = {}
        for child in children:
            if child.stalled_s >= STALL_WARN_S:
                stalled[child.group] = (*stalled.get(child.group, ()), child.stalled_s)
        self._stalled = stalled
        total = sum(len(g.slots) for g in groups)
        ready = sum(1 for c in children if c.state == "ready")
        title = f"cairnqd: master [{self._config_path}] gen={generation} children={ready}/{total}"
        if self.note:
            title += f" ({self.note})"
        if title != self._title:
            self._title = title
            setproctitle(title)
        if not self.ready_sent and not stopping and _pools_settled(groups):
            self.ready_sent = True
            systemd.ready(f"generation {generation}: {ready}/{total} children ready")
        elif not self.ready_sent and not stopping and now - self.last_extend >= _EXTEND_EVERY_S:
            waiting = sum(1 for c in children if c.state == "db_wait")
            if waiting:
                self.last_extend = now
                systemd.extend_timeout(int(_EXTEND_BY_S * 1_000_000))
                systemd.status(f"waiting for the database ({waiting} children)")
        if self.watchdog_every is not None and now - self.last_watchdog >= self.watchdog_every:
            self.last_watchdog = now
            systemd.watchdog()

    def next_due(self) -> Due | None:
        """When `tick()` must next run to ping the systemd watchdog, if it pings. (Its
        start-time extensions need no reason of their own: they are sent while children
        wait for the database, whom the loop steps at the busy tick anyway.)"""
        if self.watchdog_every is None:
            return None
        return Due(self.last_watchdog + self.watchdog_every, "systemd watchdog")

    def take_over_systemd(self, status_text: str) -> None:
        """A binary upgrade's successor became the main process: READY (which also
        ends a `systemctl reload`), and the watchdog pings are ours from now on."""
        self.ready_sent = True
        self.watchdog_every = systemd.watchdog_interval()
        self.last_watchdog = 0.0
        systemd.ready(status_text)

    def children_without_database(self) -> int:
        """Children whose last heartbeat said their database calls fail (any thread)."""
        return len(self._children_db_down)

    def health(self) -> tuple[bool, dict[str, Any]]:
        """All is well, or not, and a JSON body naming each problem: a stalled loop,
        each FATAL or crash-looping group, and database trouble the parent knows of."""
        problems = []
        stale_s = time.monotonic() - self.last_tick
        if stale_s >= _STALE_LOOP_S:
            problems.append(f"the supervisor's loop has not ticked for {stale_s:.0f}s")
        if self._stopping:
            problems.append("stopping")
        groups = self._groups
        for name, group in groups.items():
            if group.state == "fatal":
                problems.append(f"group {name} is FATAL: {group.error}")
            elif group.state == "crashloop":
                problems.append(f"group {name} is crash-looping: dead slots wait for the budget")
        problems += self._database_problems()
        if down := self._children_db_down:
            problems.append(
                f"{len(down)} child(ren) cannot reach the database (for up to {max(down):.0f}s)"
            )
        for name, stalls in sorted(self._stalled.items()):
            problems.append(
                f"group {name}: claims and lease renewals have made no progress for "
                f"{max(stalls):.0f}s in {len(stalls)} child(ren) (the database is locked, "
                "wedged or failing; the children's log names what blocks it)"
            )
        if full := self._children_full_ago:
            problems.append(
                f"{len(full)} child(ren) could not write for want of space (database or disk "
                f"is full), last {min(full):.0f}s ago: free space where the database lives"
            )
        return not problems, {
            "status": "unhealthy" if problems else "ok",
            "problems": problems,
            "groups": {name: vars(group) for name, group in groups.items()},
        }


def _group_health(group: GroupPool) -> GroupHealth:
    ready = sum(1 for s in group.slots if s.child is not None and s.child.state == "ready")
    return GroupHealth(group.state, group.fatal_error, ready, len(group.slots))


def _pools_settled(groups: Iterable[GroupPool]) -> bool:
    for group in groups:
        if group.state == "fatal":
            continue
        if any(s.child is None or s.child.state != "ready" for s in group.slots):
            return False
    return True


def status_dump(
    groups: Iterable[GroupPool],
    removed: Iterable[GroupPool],
    *,
    generation: int,
    stopping: bool,
) -> str:
    """Every pool, slot and child, for SIGUSR1: what the supervisor believes runs."""
    lines = [f"generation {generation}, stopping={stopping}"]
    now = time.monotonic()
    for group in groups:
        lines.append(f"group {group.name}: {group.state} {group.fatal_error or ''}".rstrip())
        for slot in group.slots:
            if slot.child is None:
                wait = max(0.0, slot.restart_at - now)
                lines.append(f"  slot {slot.index}: empty (restart in {wait:.1f}s)")
            else:
                lines.append(f"  slot {slot.index}: {_describe(slot.child, now)}")
            if slot.successor is not None:
                lines.append(f"  slot {slot.index} successor: {_describe(slot.successor, now)}")
        lines += [f"  retired: {_describe(child, now)}" for child in group.retired]
    for pool in removed:
        lines.append(f"removed group {pool.name}:")
        lines += [f"  retired: {_describe(child, now)}" for child in pool.retired]
    return "\n".join(lines)


def _describe(child: ChildProcess, now: float) -> str:
    del now
    longest = child.longest
    oldest = f", longest {longest.name} {longest.id} ({longest.age_s:.1f}s)" if longest else ""
    lag = f", loop lag {child.lag_s:.1f}s" if child.lag_s >= 0.5 else ""
    return (
        f"pid {child.pid} {child.state} gen {child.generation} rss {child.rss >> 20}MiB, "
        f"{child.executing} executing, {child.held} held{oldest}{lag}"
    )
