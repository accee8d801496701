"""Leadership among the hosts that share one database: `store.leadership`.

`exclusive()` holds a duty for one block (the purge), `leader_lock()` keeps it across
calls (`metrics.queue_stats: leader`, the scheduler), `take_turn()` hands one host per
interval a turn. Where one host reaches the database (a SQLite file) all three always
hold (`SOLE_HOST`); Postgres's are in store/postgres/leadership.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol


class LeaderLock(Protocol):
    """Leadership kept across calls. `ensure()` is called before each unit of
    leader-only work: True while this host leads (taking the lead when it is free),
    never waiting for another holder. `close()` gives the lead up. Idempotent."""

    key: tuple[int, int]

    async def ensure(self) -> bool: ...

    async def close(self) -> None: ...

    def sever(self) -> None:
        """Cut the lock's own session short without a word to the database (a stop
        that cannot wait for a silent one): what waits on it fails at once, and the
        lead goes with the session. Run on the lock's event loop."""


class SoleHost:
    """The `LeaderLock` of a database only one host can reach: always held."""

    def __init__(self, namespace: int, lock_id: int) -> None:
        self.key = (namespace, lock_id)

    async def ensure(self) -> bool:
        return True

    async def close(self) -> None:
        return None

    def sever(self) -> None:
        return None


class Leadership(Protocol):
    """How the hosts on one database share the duties only one of them may do."""

    def exclusive(self, namespace: int, lock_id: int) -> AbstractAsyncContextManager[bool]:
        """Hold `(namespace, lock_id)` for the block if no other host does; yields
        whether it is held, never waiting."""
        ...

    def leader_lock(self, namespace: int, lock_id: int) -> LeaderLock:
        """Leadership on `(namespace, lock_id)` kept across calls."""
        ...

    async def take_turn(self, name: str, every_ms: int) -> bool:
        """Whether this host takes the turn `name` now, when one host per `every_ms`
        should."""
        ...


class _SoleHostLeadership:
    """The leadership of a database only one host can reach: always held."""

    def exclusive(self, namespace: int, lock_id: int) -> AbstractAsyncContextManager[bool]:
        return _always_held()

    def leader_lock(self, namespace: int, lock_id: int) -> LeaderLock:
        return SoleHost(namespace, lock_id)

    async def take_turn(self, name: str, every_ms: int) -> bool:
        return True


@asynccontextmanager
async def _always_held() -> AsyncIterator[bool]:
    yield True


SOLE_HOST: Leadership = _SoleHostLeadership()

__all__ = ["SOLE_HOST", "LeaderLock", "Leadership", "SoleHost"]
