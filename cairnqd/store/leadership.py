"""Leadership among the hosts that share one database, as the daemon needs it.

Some duties must run on one host at a time (the purge sweep), or are answered by one
host for all (`metrics.queue_stats: leader`). A store says how: `exclusive()` for work
done in one block, `leader_lock()` for leadership kept across many calls. A SQLite
file has one host by construction, so there both always hold; Postgres uses advisory
locks on sessions of their own (store/postgres/leadership.py).
"""

from __future__ import annotations

from typing import Protocol


class LeaderLock(Protocol):
    """Leadership kept across calls. `ensure()` is called before each unit of
    leader-only work: True while this host leads (taking the lead when it is free),
    never waiting for another holder. `close()` gives the lead up. Idempotent."""

    key: tuple[int, int]

    async def ensure(self) -> bool: ...

    async def close(self) -> None: ...


class SoleHost:
    """The `LeaderLock` of a database only one host can reach: always held."""

    def __init__(self, namespace: int, lock_id: int) -> None:
        self.key = (namespace, lock_id)

    async def ensure(self) -> bool:
        return True

    async def close(self) -> None:
        return None


__all__ = ["LeaderLock", "SoleHost"]
