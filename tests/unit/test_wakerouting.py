"""WakeRouter: which children a relayed wake-up goes to (daemon/parent/wakerouting.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cairnqd.config import load_config
from cairnqd.daemon.parent.wakerelay import SETTLED
from cairnqd.daemon.parent.wakerouting import WakeRouter, limited_groups, wake_line
from cairnqd.daemon.wire.messages import Wake, decode_control, encode

GROUPS = {"web": ("mail", "thumbs"), "batch": ("reports",)}


@dataclass
class Kid:
    pid: int
    group: str = "web"
    room: bool = True


def router() -> WakeRouter:
    return WakeRouter(lambda group: GROUPS.get(group, ()))


def pids(sends: Sequence[tuple[Kid, tuple[str, ...]]]) -> list[int]:
    return [child.pid for child, _ in sends]


def test_one_notification_goes_to_one_child_with_room_in_turn() -> None:
    wakes = router()
    kids = [Kid(1), Kid(2), Kid(3)]
    chosen = [pids(wakes.route({"mail": 1}, kids)) for _ in range(6)]
    assert chosen == [[1], [2], [3], [1], [2], [3]]


def test_the_wake_names_the_groups_notified_queues_only() -> None:
    wakes = router()
    sends = wakes.route({"mail": 1, "reports": 1, "elsewhere": 1}, [Kid(1), Kid(2, "batch")])
    assert sorted((c.pid, q) for c, q in sends) == [(1, ("mail",)), (2, ("reports",))]


def test_a_group_claiming_none_of_the_queues_gets_nothing() -> None:
    assert router().route({"reports": 3}, [Kid(1), Kid(2)]) == []


def test_children_without_room_are_passed_over() -> None:
    wakes = router()
    kids = [Kid(1, room=False), Kid(2), Kid(3, room=False), Kid(4)]
    chosen = [pids(wakes.route({"thumbs": 1}, kids)) for _ in range(4)]
    assert chosen == [[2], [4], [2], [4]]


def test_without_a_child_with_room_every_child_of_the_group_is_woken() -> None:
    wakes = router()
    kids = [Kid(1, room=False), Kid(2, room=False), Kid(3, "batch", room=True)]
    assert sorted(pids(wakes.route({"mail": 1}, kids))) == [1, 2]


def test_several_notifications_wake_as_many_children_with_room() -> None:
    wakes = router()
    kids = [Kid(1), Kid(2), Kid(3)]
    assert sorted(pids(wakes.route({"mail": 2}, kids))) == [1, 2]
    # Counted across the group's queues, never more than one wake a child.
    assert sorted(pids(wakes.route({"mail": 4, "thumbs": 3}, kids))) == [1, 2, 3]
    (send,) = wakes.route({"mail": 1, "thumbs": 1}, [Kid(1)])
    assert send[1] == ("mail", "thumbs")


def test_turns_spread_evenly_while_children_come_and_go() -> None:
    wakes = router()
    kids = [Kid(1), Kid(2)]
    seen: Counter[int] = Counter()
    for n in range(100):
        if n == 50:
            kids.append(Kid(3))
        seen.update(pids(wakes.route({"mail": 1}, kids)))
    assert seen[1] + seen[2] + seen[3] == 100
    assert seen[3] >= 15 and abs(seen[1] - seen[2]) <= 2


def test_a_child_that_fills_up_hands_on_what_it_was_sent() -> None:
    wakes = router()
    one, two = Kid(1), Kid(2)
    kids = [one, two]
    assert pids(wakes.route({"mail": 1}, kids)) == [1]
    one.room = False
    sends = wakes.room_changed(one, kids)
    assert [(c.pid, q) for c, q in sends] == [(2, ("mail",))]
    # Handed on once: the next flip has nothing owed.
    one.room = True
    assert wakes.room_changed(one, kids) == []
    one.room = False
    assert wakes.room_changed(one, kids) == []


def test_a_child_that_says_it_has_room_keeps_what_it_was_sent() -> None:
    wakes = router()
    one, two = Kid(1), Kid(2)
    assert pids(wakes.route({"mail": 1}, [one, two])) == [1]
    assert wakes.room_changed(one, [one, two]) == []  # still room: it claims
    one.room = False
    assert wakes.room_changed(one, [one, two]) == []  # nothing owed any more


def test_handed_on_to_all_when_no_other_child_has_room() -> None:
    wakes = router()
    one, two, three = Kid(1), Kid(2, room=False), Kid(3, room=False)
    kids = [one, two, three]
    assert pids(wakes.route({"thumbs": 1}, kids)) == [1]
    one.room = False
    assert sorted(pids(wakes.room_changed(one, kids))) == [2, 3]


def test_a_dead_child_hands_on_what_it_was_sent() -> None:
    wakes = router()
    one, two = Kid(1), Kid(2)
    assert pids(wakes.route({"mail": 1}, [one, two])) == [1]
    one.room = False  # reaped: `ChildChannels.reap` says it has no room
    assert pids(wakes.room_changed(one, [two])) == [2]


def test_a_child_sent_a_wake_with_the_others_owes_nothing() -> None:
    wakes = router()
    one, two = Kid(1, room=False), Kid(2, room=False)
    assert sorted(pids(wakes.route({"mail": 1}, [one, two]))) == [1, 2]
    assert wakes.room_changed(one, [one, two]) == []


def test_the_groups_queues_are_asked_at_each_routing() -> None:
    groups = {"web": ("mail",)}
    wakes = WakeRouter(lambda group: groups.get(group, ()))
    assert wakes.route({"thumbs": 1}, [Kid(1)]) == []
    groups["web"] = ("mail", "thumbs")  # a reload
    assert pids(wakes.route({"thumbs": 1}, [Kid(1)])) == [1]


def test_settlements_go_to_the_groups_a_limit_may_hold_back(tmp_path: Path) -> None:
    def groups_under(limits: dict[str, Any]) -> frozenset[str]:
        path = tmp_path / "cairnq.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "version": 1,
                    "handlers": ["cairnqd.demo:registry"],
                    "database": {"dsn": "postgresql://localhost/q"},
                    "groups": {
                        "web": {"queues": ["mail", "thumbs"]},
                        "batch": {"queues": ["reports"]},
                    },
                    "limits": limits,
                }
            )
        )
        return limited_groups(load_config(path, env={}))

    assert groups_under({}) == frozenset()
    assert groups_under({"smtp": {"queues": ["mail"], "concurrency": 3}}) == {"web"}
    # A limit by task name alone covers those tasks on any queue.
    assert groups_under({"gpu": {"names": ["render.*"], "concurrency": 1}}) == {"web", "batch"}


def test_a_wake_line_is_made_once_per_queue_set_and_reads_back_as_sent() -> None:
    line = wake_line(("mail", "thumbs"))
    assert wake_line(("mail", "thumbs")) is line  # made once, sent many times
    message = decode_control(line)
    assert isinstance(message, Wake) and message.queues == ("mail", "thumbs")
    assert line == encode(Wake(queues=("mail", "thumbs")))
    assert decode_control(wake_line((SETTLED,))) == Wake(queues=(SETTLED,))
