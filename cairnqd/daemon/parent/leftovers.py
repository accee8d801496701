"""What a child leaves behind: the processes its handlers started.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Collection
from dataclasses import dataclass

log = logging.getLogger("cairnqd.supervisor")

#: How long what a child left may take over SIGTERM before it gets SIGKILL; the
#: same grace a child gets between SIGQUIT and SIGKILL (`deadlines.QUIT_GRACE_S`).
GRACE_S = 2.0


@dataclass
class _Group:
    pgid: int
    owner: str
    termed_at: float
    killed_at: float | None = None


def signal_group(pgid: int, signum: int) -> bool:
    """Send `signum` to process group `pgid`; False when it has no process left (or
    none we may signal)."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def has_members(pgid: int, proc: str = "/proc") -> bool:
    """Whether group `pgid` still has a process that is not a zombie (a zombie is
    dead already, and waits for a reaper that may be slow, or be us)."""
    if not signal_group(pgid, 0):
        return False
    try:
        entries = os.listdir(proc)
    except OSError:
        return True  # no /proc: the signal's answer is all there is
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "stat"), "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command: state, ppid, pgrp.
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] not in (b"Z", b"X"):
            return True
    return False


class Leftovers:
    """The process groups of reaped children that still have members."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self._groups: dict[int, _Group] = {}

    @property
    def empty(self) -> bool:
        return not self._groups

    def sweep(self, pgid: int, owner: str, now: float) -> None:
        """The child that led `pgid` has been reaped: SIGTERM to what it left."""
        if not has_members(pgid) or not signal_group(pgid, signal.SIGTERM):
            return
        log.info(
            "%s left processes running (its handlers started them); ending them: "
            "SIGTERM, then SIGKILL in %gs",
            owner, self.grace_s,
        )  # fmt: skip
        self._groups[pgid] = _Group(pgid, owner, termed_at=now)

    def check(self, now: float, live_pids: Collection[int]) -> None:
        """SIGKILL to groups still there past the grace; forget the empty ones."""
        for group in list(self._groups.values()):
            if group.pgid in live_pids or not has_members(group.pgid):
                del self._groups[group.pgid]  # empty (its id may now be a new child's)
            elif group.killed_at is None:
                if now - group.termed_at > self.grace_s:
                    log.warning(
                        "processes %s left are still running %gs after SIGTERM; "
                        "killing them (SIGKILL)", group.owner, self.grace_s,
                    )  # fmt: skip
                    signal_group(group.pgid, signal.SIGKILL)
                    group.killed_at = now
            elif now - group.killed_at > self.grace_s:
                # Unkillable for now (uninterruptible sleep); not worth holding a stop for.
                log.warning(
                    "processes %s left survive SIGKILL (process group %d); leaving them",
                    group.owner, group.pgid,
                )  # fmt: skip
                del self._groups[group.pgid]

    def kill_all(self) -> None:
        """SIGKILL to every group still known: the daemon is exiting now."""
        for group in self._groups.values():
            signal_group(group.pgid, signal.SIGKILL)
        self._groups.clear()
