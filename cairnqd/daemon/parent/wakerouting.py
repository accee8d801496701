"""Which children a relayed wake-up goes to: one with room per notification, in turn.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from cairnqd.config import Config
from cairnqd.daemon.parent.pool import ChildProcess
from cairnqd.daemon.wire.messages import Wake, encode
from cairnqd.limits import may_cover


class Wakeable(Protocol):
    """What routing needs of a child (a `ChildProcess`, or a stand-in in tests)."""

    @property
    def pid(self) -> int: ...

    @property
    def group(self) -> str: ...

    @property
    def room(self) -> bool: ...


W = TypeVar("W", bound=Wakeable)
#: A child and the queues of the `wake` it is sent.
Send = tuple[W, tuple[str, ...]]


class WakeRouter:
    """Routes the notifications the parent's LISTEN heard (queue -> how many) to the
    children that should claim them; keeps no process, pipe or clock of its own."""

    def __init__(self, queues_of: Callable[[str], Sequence[str]]) -> None:
        #: A group's queues, as the config in force says (a reload may change them).
        self._queues_of = queues_of
        #: Per group, where the next turn starts among its children with room.
        self._turns: dict[str, int] = {}
        #: Per child (pid), the queues routed to it alone since it last said whether it
        #: has room: what another child must be told if it turns out to have none.
        self._owed: dict[int, set[str]] = {}

    def route(self, notified: Mapping[str, int], children: Sequence[W]) -> list[Send[W]]:
        """For each group that claims from a notified queue: a `wake` for its notified
        queues to as many of its children with room as there were notifications (one,
        usually), taking turns; to every child of the group when none has room, so
        that whichever frees a slot first claims. `children`: those a wake can reach
        now (not backed up)."""
        members: dict[str, list[W]] = {}
        for child in children:
            members.setdefault(child.group, []).append(child)
        sends: list[Send[W]] = []
        for group, of_group in members.items():
            hit = tuple(q for q in self._queues_of(group) if q in notified)
            if not hit:
                continue
            roomy = [c for c in of_group if c.room]
            if not roomy:
                sends.extend((c, hit) for c in of_group)
                continue
            # Postgres folds identical notifications of one transaction into one, so
            # this undercounts a batch; a child that fills up hands the rest on
            # (`room_changed`).
            wanted = min(len(roomy), sum(notified[q] for q in hit))
            turn = self._turns.get(group, 0) % len(roomy)
            for i in range(wanted):
                child = roomy[(turn + i) % len(roomy)]
                self._owed.setdefault(child.pid, set()).update(hit)
                sends.append((child, hit))
            self._turns[group] = turn + wanted
        return sends

    def room_changed(self, child: W, children: Sequence[W]) -> list[Send[W]]:
        """`child` said whether it has room (`child.room`), or died (no room). With
        room, it will claim what it was sent: nothing to do. Without, the wake-ups it
        was sent alone since it last said so go to the others, routed as new: it may
        have filled up before claiming them (its slots taken by tasks claimed ahead, or
        a claim already under way), and a task must not wait for its slot while
        another child has one free. At worst (it had claimed them) another child
        makes one claim that finds nothing, once per fill-up, never per task."""
        owed = self._owed.pop(child.pid, None)
        if child.room or not owed:
            return []
        others = [c for c in children if c.pid != child.pid]
        return self.route(dict.fromkeys(owed, 1), others)


def limited_groups(config: Config) -> frozenset[str]:
    """The groups whose tasks a flow-control limit may hold back: those whose claims
    keep limits (`may_cover`, as the children's stores decide)."""
    limits = config.flow_limits()
    return frozenset(g for g, group in config.groups.items() if may_cover(limits, group.queues))


def deliver(sends: Iterable[Send[ChildProcess]]) -> None:
    """Write each routed `wake` to its child's control pipe."""
    for child, queues in sends:
        child.control.send_whole(wake_line(queues))


@functools.lru_cache(maxsize=1024)
def wake_line(queues: tuple[str, ...]) -> bytes:
    """The encoded `wake` for `queues`, made once: the parent sends one per notification
    (hundreds a second under a stream), always for one of the few queue sets its
    groups claim from, and encoding the message was a fifth of the relay's CPU."""
    return encode(Wake(queues=queues))


__all__ = ["WakeRouter", "Wakeable", "deliver", "limited_groups", "wake_line"]
