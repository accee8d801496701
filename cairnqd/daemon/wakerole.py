"""Which child of a group answers wake-ups: the one holding the group's wake lock.

Every child of a group hears every wake-up (on Postgres each LISTENs; on SQLite each
watches the file), and each then claims: one finds the task, the others find nothing.
On a host with few cores those empty claims were most of the daemon's CPU under a
steady stream (bench/RESULTS.md, "Under a steady stream"). So one child at a time
answers them: the one holding an exclusive `flock` on a file beside the daemon's state
file, taken only while a task it claimed would start at once (a free call slot, claiming
on). A child that stays full for 2 ms (20 ms on SQLite) lets go, and a sibling with
room, blocked on the lock in a thread, takes it and claims at once. A child that dies
lets go with its last file descriptor. The others keep their LISTEN (its events wait,
set, for the moment they take the role) and claim on their poll interval, as every
child always did.

The reasoning: docs/architecture.md, "cairnqd/daemon/wakerole.py".
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable

__all__ = ["RoomLook", "WakeRole", "wake_lock_path"]

log = logging.getLogger("cairnqd.daemon")


def wake_lock_path(state_path: str, group: str) -> str:
    """The group's lock file, beside the daemon's state file (`cairnqd-<hash>.json`): a
    successor of an upgrade in place keeps the state file, so its children and the old
    ones share one role per group."""
    return f"{state_path.removesuffix('.json')}.wake-{group}"


class RoomLook:
    """Told when a worker flips between "a task claimed now would start at once" and
    not (`slots`, the worker's `on_room` hook) and when claiming is switched on or off
    (`check`), it looks at the end of the loop's turn: `_look` gets whether the child
    has room and claims. One look per turn, so a slot freed and refilled from the
    backlog in the same turn changes nothing."""

    def __init__(self, may_claim: Callable[[], bool]) -> None:
        self._may_claim = may_claim
        self._slots_free = False
        self._queued = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def slots(self, free: bool) -> None:
        """The worker's `on_room` hook."""
        self._slots_free = free
        self.check()

    def check(self) -> None:
        """Look again at the end of this turn of the loop (from any thread)."""
        loop = self._loop
        if loop is None or self._queued:
            return
        self._queued = True
        loop.call_soon_threadsafe(self._turn)

    def _turn(self) -> None:
        self._queued = False
        self._look(self._slots_free and self._may_claim())

    def _look(self, room: bool) -> None:
        raise NotImplementedError


class WakeRole(RoomLook):
    """The child's side of the group's wake lock, taken while the child has room and
    claims (`RoomLook`). The claim loop asks `holding` before it waits for a wake-up,
    and a child without the role waits in `until_held` instead."""

    #: How long a holder stays full before it lets go (`_still_filling`).
    LET_GO_AFTER_S = 0.002
    #: The same where the database has one writer (SQLite): a sibling that takes over
    #: sooner cannot claim beside the holder anyway, only after it.
    ONE_WRITER_LET_GO_AFTER_S = 0.02

    def __init__(
        self, path: str, may_claim: Callable[[], bool], *, let_go_after_s: float = LET_GO_AFTER_S
    ) -> None:
        super().__init__(may_claim)
        self.path = path
        self.let_go_after_s = let_go_after_s
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        # A handler that forks (os.fork, multiprocessing) would share this descriptor's
        # lock with its process, which could hold the role long after we let go or died.
        os.register_at_fork(after_in_child=self._forget)
        #: A thread is blocked taking the lock; it hands the lock to the loop.
        self._waiting = False
        #: When the child, holding the role, was first seen full (`_still_filling`).
        self._full_since: float | None = None
        self._held: asyncio.Event | None = None

    @property
    def holding(self) -> bool:
        return self._held is not None and self._held.is_set()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        super().start(loop)
        self._held = asyncio.Event()
        self.check()

    async def until_held(self, timeout_s: float) -> None:
        """Return when this child takes the role, or after `timeout_s`."""
        assert self._held is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._held.wait(), timeout_s)

    def close(self) -> None:
        """Let go for good (the child is ending): a sibling takes over now rather than
        when this process is gone."""
        fd, self._fd = self._fd, None
        if self._held is not None:
            self._held.clear()
        if fd is not None:
            # A thread blocked in flock keeps the open file alive; the lock it may
            # still take goes when that call returns and drops the last reference.
            os.close(fd)

    # -- the loop's side -------------------------------------------------------------

    def _look(self, room: bool) -> None:
        if self._fd is None or self._held is None:
            return
        if not room:
            if self._held.is_set() and not self._still_filling():
                self._full_since = None
                self._held.clear()
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            return
        self._full_since = None
        if self._held.is_set() or self._waiting:
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._wait_in_thread()
            return
        self._held.set()

    def _still_filling(self) -> bool:
        """Full, but for less than `let_go_after_s`, and still claiming: keep the role
        and look again then. The calls a claim has just started may end within a few
        turns of the loop, and a sibling woken for the role takes longer than that
        to claim; meanwhile the stream piles up behind it, its next claim fills it
        in turn, and the role went back and forth on every claim that filled one."""
        if not self._may_claim():
            return False  # stopping or quiet: let go now
        now = time.monotonic()
        if self._full_since is None:
            self._full_since = now
        left = self._full_since + self.let_go_after_s - now
        if left <= 0:
            return False
        assert self._loop is not None
        self._loop.call_later(left, self.check)
        return True

    def _wait_in_thread(self) -> None:
        assert self._fd is not None and self._loop is not None
        self._waiting = True
        threading.Thread(
            target=self._block, args=(self._fd, self._loop), name="wake-role", daemon=True
        ).start()

    def _block(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            outcome: OSError | None = exc
        else:
            outcome = None
        with contextlib.suppress(RuntimeError):  # the loop closed: the process is ending
            loop.call_soon_threadsafe(self._taken, fd, outcome)

    def _taken(self, fd: int, error: OSError | None) -> None:
        self._waiting = False
        if fd != self._fd or self._held is None:
            return  # closed meanwhile: the lock went with the descriptor
        if error is not None:
            # Not expected of a local file; the poll still finds the work.
            log.warning("could not take the group's wake lock %s: %s", self.path, error)
            return
        self._held.set()
        # Still wanted? The flags may have flipped while the thread waited.
        self.check()

    def _forget(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
