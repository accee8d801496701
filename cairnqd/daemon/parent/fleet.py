"""Every pool the supervisor runs, and which pool each child belongs to.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from cairnqd.config import Config, GroupConfig
from cairnqd.daemon.parent.pool import ChildProcess, GroupPool, Slot
from cairnqd.daemon.parent.reload import ReloadPlan

log = logging.getLogger("cairnqd.supervisor")

#: Spawns a child of a group's config into a slot (by index), of a generation.
Spawn = Callable[[GroupConfig, int, int], ChildProcess]
#: Children a pool let go of, to be stopped within their pool's drain timeout.
Retiring = list[tuple[GroupPool, ChildProcess]]


@dataclass(frozen=True)
class Detached:
    """Where a reaped child was: its configured pool (None: a removed group's, or
    not found), its role there and its slot."""

    pool: GroupPool | None
    role: str | None
    slot: Slot | None


class Fleet:
    def __init__(self, config: Config) -> None:
        self.groups: dict[str, GroupPool] = {
            name: GroupPool(group, config.group_fingerprint(name), config)
            for name, group in config.groups.items()
        }
        #: Pools of groups a reload removed, until their last child is reaped.
        self.removed: list[GroupPool] = []
        self._reported: set[str] = set()

    def pools(self) -> list[GroupPool]:
        """Every pool that may own a child: the configured ones, then removed ones."""
        self.removed = [pool for pool in self.removed if pool.children()]
        return [*self.groups.values(), *self.removed]

    def children(self) -> list[ChildProcess]:
        return [child for pool in self.pools() for child in pool.children()]

    def fatal_groups(self) -> list[str]:
        return [name for name, pool in self.groups.items() if pool.state == "fatal"]

    def rolling(self) -> bool:
        return any(pool.rolling for pool in self.groups.values())

    def all_fatal(self) -> bool:
        """Every configured group is FATAL and has no child left."""
        pools = self.groups.values()
        return bool(pools) and all(p.state == "fatal" and not p.children() for p in pools)

    def detach(self, child: ChildProcess) -> Detached:
        """Take a reaped child out of its pool: which pool (None for a removed
        group's), in what role (`slot`, `successor`, `retired`) and which slot."""
        for pool in self.pools():
            found = pool.detach(child)
            if found is None:
                continue
            role, slot = found
            if all(pool is not kept for kept in self.groups.values()):
                return Detached(None, role, slot)
            return Detached(pool, role, slot)
        return Detached(None, None, None)

    # -- keeping pools at size ------------------------------------------------------------

    def fill(self, spawn: Spawn, generation: int, only: Collection[str] | None = None) -> None:
        """Spawn into every empty slot whose pool may spawn now; with `only`, in the
        pools of those groups alone (a successor starts its groups one by one)."""
        now = time.monotonic()
        for pool in self.groups.values():
            if only is not None and pool.name not in only:
                continue
            if pool.cooled_down(now):
                log.warning(
                    "group %s: trying again after %.0fs FATAL (%s)",
                    pool.name, pool.fatal_cooldown_s, pool.fatal_error,
                )  # fmt: skip
                pool.revive()
            for slot in pool.slots:
                if slot.child is None and pool.may_spawn(slot, now):
                    slot.child = spawn(pool.config, slot.index, generation)

    def advance_rolls(self, surge: int, spawn: Spawn, generation: int) -> Retiring:
        """One step of every roll; returns the replaced children, now retired, for the
        caller to stop."""
        replaced = []
        for pool in self.groups.values():
            step = pool.advance_roll(surge, _into_slot(spawn, pool.config, generation))
            replaced += [(pool, child) for child in step]
        return replaced

    # -- reload ---------------------------------------------------------------------------

    def apply(self, plan: ReloadPlan) -> Retiring:
        """Reshape the pools as `plan` says; returns the children to stop (removed
        groups, shrunk pools). Rolls start here and advance with `advance_rolls`."""
        config = plan.config
        retiring: Retiring = []
        for name in plan.removed:
            pool = self.groups.pop(name)
            retiring += [(pool, child) for child in pool.retire_all()]
            self.removed.append(pool)
        for name in plan.revived:
            # Every reload retries a FATAL group with a fresh budget. The pool stays:
            # children it still has keep serving, and keep their slots.
            self.groups[name].revive()
        pools: dict[str, GroupPool] = {}
        for name, group in config.groups.items():
            fingerprint = config.group_fingerprint(name)
            kept = self.groups.get(name)
            if kept is None:
                pools[name] = GroupPool(group, fingerprint, config)
                continue
            kept.reconfigure(group, fingerprint, config)
            retiring += [(kept, child) for child in kept.resize(group.processes)]
            pools[name] = kept
        self.groups = pools
        for name in plan.rolled:
            self.groups[name].start_roll()
        return retiring

    # -- the invariant ----------------------------------------------------------------------

    def check_ownership(self, live: Collection[ChildProcess]) -> None:
        """Log each ownership problem once: such a child would escape drain,
        deadlines and hand-back, which is a bug worth shouting about."""
        for problem in self.ownership_problems(live):
            if problem not in self._reported:
                self._reported.add(problem)
                log.error("bookkeeping bug: %s", problem)

    def ownership_problems(self, live: Collection[ChildProcess]) -> list[str]:
        """What breaks "every live child belongs to exactly one pool": children no
        pool owns, children owned twice, and pool entries for children not alive."""
        owners: dict[int, list[str]] = {}
        for pool in self.pools():
            for child in pool.children():
                owners.setdefault(id(child), []).append(pool.name)
        problems = []
        for child in live:
            found = owners.pop(id(child), [])
            if len(found) != 1:
                where = ", ".join(found) or "no pool"
                problems.append(f"child {child.pid} of {child.group} is owned by {where}")
        problems += [f"a pool of {names[0]} holds a dead child" for names in owners.values()]
        return problems


def _into_slot(spawn: Spawn, config: GroupConfig, generation: int) -> Callable[[int], ChildProcess]:
    return lambda index: spawn(config, index, generation)
