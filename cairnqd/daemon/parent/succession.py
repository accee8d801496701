"""The new parent's side of a binary upgrade: start the groups one by one beside the
running parent's, say `ready` once every group is, and serve when told `yours`.

Until then this parent is an apprentice: it holds the state file's lock and the
listening sockets it inherited but serves none of them, runs no maintenance and
talks to no one but the running parent. If anything goes wrong (a group that cannot
boot, the deadline, the running parent closing the link) it says why, drains what
it started and exits; the running parent carries on as if nothing had happened.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping, Sequence

from cairnqd.daemon.parent.pool import GroupPool
from cairnqd.daemon.parent.upgrade_link import (
    ENV_VAR,
    Inheritance,
    InheritanceError,
    LinkMessage,
    decode_lines,
    send,
)
from cairnqd.daemon.wire.pipes import MessageReader, PipeError

log = logging.getLogger("cairnqd.supervisor")


class Succession:
    """`state`: `starting` (groups admitted one at a time), `ready` (said so; waiting
    for `yours`), `promoted` (this parent serves) or `aborted`."""

    def __init__(self, inheritance: Inheritance, groups: Sequence[str], timeout_s: float) -> None:
        self.inheritance = inheritance
        self.reader = MessageReader(inheritance.link_fd)
        self.order = list(groups)
        #: Groups whose children may spawn: the first at once, each next one once
        #: every group before it is ready.
        self.admitted: set[str] = set(self.order[:1])
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.state = "starting"
        self._told: dict[str, int] = {}
        self._closed = False

    @property
    def from_pid(self) -> int:
        return self.inheritance.from_pid

    @property
    def link_fd(self) -> int:
        """Our end of the link; -1 once closed (its number may then be reused)."""
        return -1 if self._closed else self.inheritance.link_fd

    @property
    def serving(self) -> bool:
        return self.state == "promoted"

    def hello(self, *, version: str, pipe_protocol: int, generation: int) -> None:
        self._send(
            LinkMessage(
                "hello",
                {
                    "pid": os.getpid(),
                    "version": version,
                    "pipe_protocol": pipe_protocol,
                    "generation": generation,
                },
            )
        )

    def step(self, groups: Mapping[str, GroupPool], now: float) -> list[str]:
        """One tick while starting: admit the next group once the ones admitted are
        ready, tell the running parent how far we are, say `ready` at the end.
        Returns the reasons to give up (a group that cannot boot, the deadline), or
        nothing while all goes well."""
        if self.state != "starting":
            return []
        for name in self.order:
            pool = groups.get(name)
            if pool is None or name not in self.admitted:
                continue
            if pool.state == "fatal":
                return [f"group {name} cannot start under the new code: {pool.fatal_error}"]
            ready = _ready(pool)
            if self._told.get(name) != ready:
                self._told[name] = ready
                progress = {"group": name, "ready": ready, "of": len(pool.slots)}
                self._send(LinkMessage("progress", progress))
        waiting = [n for n in self.order if n in self.admitted and not _all_ready(groups[n])]
        if not waiting:
            following = [n for n in self.order if n not in self.admitted]
            if following:
                log.info("upgrade: group %s is ready; starting group %s",
                         self.order[self.order.index(following[0]) - 1], following[0])  # fmt: skip
                self.admitted.add(following[0])
                return []
            self.state = "ready"
            log.info("upgrade: every group is ready; asking pid %d to hand over", self.from_pid)
            self._send(LinkMessage("ready"))
            return []
        if now >= self.deadline:
            late = ", ".join(
                f"{n} ({_ready(groups[n])}/{len(groups[n].slots)} ready)" for n in waiting
            )
            return [
                f"not every group was ready within reload.upgrade_timeout "
                f"({self.timeout_s:g}s): {late}"
            ]
        return []

    def read(self) -> str | None:
        """What the link says now: `yours` (serve), `gone` (the running parent closed
        it before handing over), or None."""
        try:
            lines = self.reader.read_lines()
        except PipeError:
            lines = []
            self.reader.closed = True
        for message in decode_lines(lines, "the running parent"):
            if message.kind == "yours" and self.state in ("starting", "ready"):
                self.state = "promoted"
                return "yours"
        if self.reader.closed and self.state in ("starting", "ready"):
            return "gone"
        return None

    def orphaned(self) -> bool:
        """The running parent has died (we were reparented), rather than let go."""
        return os.getppid() != self.from_pid

    def promote_orphan(self) -> None:
        """The running parent died before handing over: serve, as it would have."""
        self.state = "promoted"

    def abort(self, errors: Sequence[str]) -> None:
        """Give up: tell the running parent why; the supervisor drains our children."""
        if self.state in ("aborted", "promoted"):
            return
        self.state = "aborted"
        for line in errors:
            log.error("upgrade abandoned: %s", line)
        self._send(LinkMessage("abort", {"errors": list(errors)}))

    def close(self) -> None:
        """Close our end of the link. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            os.close(self.inheritance.link_fd)

    def _send(self, message: LinkMessage) -> None:
        if not self._closed:
            send(self.inheritance.link_fd, message)


def _ready(pool: GroupPool) -> int:
    return sum(1 for s in pool.slots if s.child is not None and s.child.state == "ready")


def _all_ready(pool: GroupPool) -> bool:
    return _ready(pool) == len(pool.slots)


def report_failed_start(errors: Sequence[str], inheritance: Inheritance | None = None) -> None:
    """A successor that fails before its supervisor runs (its config does not load)
    tells the running parent why, so `cairnqd upgrade --wait` prints the problem; a
    no-op for an ordinary start."""
    if inheritance is None:
        text = os.environ.get(ENV_VAR)
        if text is None:
            return
        try:
            inheritance = Inheritance.decode(text)
        except InheritanceError:
            return
    send(inheritance.link_fd, LinkMessage("abort", {"errors": list(errors)}))
