"""Fleet: which pool owns each child, through reload plans, without real processes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from cairnqd.config import Config, load_config
from cairnqd.daemon.parent.fleet import Fleet
from cairnqd.daemon.parent.pool import ChildProcess
from cairnqd.daemon.parent.reload import plan_reload

BASE = """\
version: 1
database: {path: ./t.db}
handlers: [cairnqd.demo:registry]
groups:
  mail: {queues: [mail], processes: 2}
  bulk: {queues: [bulk]}
"""


def load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "cairnq.yaml"
    path.write_text(text)
    return load_config(path)


class Spawner:
    """Stands in for the supervisor's spawn: records children, starts no process."""

    def __init__(self) -> None:
        self.spawned: list[ChildProcess] = []

    def __call__(self, group: Any, slot: int, generation: int) -> ChildProcess:
        pid = 1000 + len(self.spawned)
        child = ChildProcess(
            group=group.name, slot=slot, generation=generation, worker_id=f"w{pid}",
            proc=SimpleNamespace(pid=pid), events=None, control=None, spawned_at=0.0,
        )  # type: ignore[arg-type]  # fmt: skip
        self.spawned.append(child)
        return child


def test_every_child_stays_in_one_pool_through_fatal_and_removal(tmp_path: Path) -> None:
    config = load(tmp_path, BASE)
    fleet, spawn = Fleet(config), Spawner()
    fleet.fill(spawn, 1)
    assert len(spawn.spawned) == 3 and fleet.ownership_problems(spawn.spawned) == []
    mail = fleet.groups["mail"]
    survivor, reaped = mail.slots[0].child, mail.slots[1].child
    assert survivor is not None and reaped is not None
    assert fleet.detach(reaped).role == "slot"
    mail.mark_fatal("ImportError: boom", 0.0)  # its replacement could not boot
    live = [c for c in spawn.spawned if c is not reaped]
    # A reload revives the FATAL pool in place and removes bulk, whose child drains.
    plan = plan_reload(config, load(tmp_path, BASE.replace("  bulk: {queues: [bulk]}\n", "")),
                       fatal=fleet.fatal_groups(), roll_all=False)  # fmt: skip
    retiring = fleet.apply(plan)
    assert [(pool.name, child.group) for pool, child in retiring] == [("bulk", "bulk")]
    assert fleet.groups["mail"] is mail and mail.state == "running"
    assert mail.slots[0].child is survivor
    assert [pool.name for pool in fleet.removed] == ["bulk"]
    assert fleet.ownership_problems(live) == []
    # The invariant's alarms: a live child no pool owns, and a pool holding a dead one.
    stray = Spawner()(config.groups["mail"], 0, 1)
    assert fleet.ownership_problems([*live, stray]) == [
        f"child {stray.pid} of mail is owned by no pool"
    ]
    assert fleet.ownership_problems([survivor]) == ["a pool of bulk holds a dead child"]
