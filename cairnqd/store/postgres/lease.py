"""Leadership without a session: lease rows in `cairnqd_leases`, for a transaction
pooler, where a session advisory lock means nothing (docs/architecture.md, "Leadership
behind a transaction pooler").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from cairnqd.store.base import Row

#: How long a lease lasts without renewal: the takeover bound after a holder dies.
LEASE_TTL_MS = 15_000

Fetch = Callable[[str, Mapping[str, Any]], Awaitable[list[Row]]]


def new_holder() -> str:
    """A holder name unique to this lock object: host, pid and a random tag."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def lease_name(namespace: int, lock_id: int) -> str:
    """The row that stands for the advisory lock `(namespace, lock_id)`."""
    return f"lock:{namespace}:{lock_id}"


async def take(fetch: Fetch, name: str, holder: str, ttl_ms: int) -> bool:
    rows = await fetch("lease_take", {"name": name, "holder": holder, "ttl_ms": ttl_ms})
    return bool(rows)


async def release(fetch: Fetch, name: str, holder: str) -> None:
    await fetch("lease_release", {"name": name, "holder": holder})


class LeaseLock:
    """A `LeaderLock` on a lease row: `ensure()` renews the lease while held, or takes
    it when free; `close()` gives it up. Not thread-safe: use it from one event loop."""

    def __init__(
        self, fetch: Fetch, namespace: int, lock_id: int, *, ttl_ms: int = LEASE_TTL_MS
    ) -> None:
        self.key = (namespace, lock_id)
        self._fetch = fetch
        self._name = lease_name(namespace, lock_id)
        self._holder = new_holder()
        self._ttl_ms = ttl_ms
        self._held = False

    async def ensure(self) -> bool:
        try:
            self._held = await take(self._fetch, self._name, self._holder, self._ttl_ms)
        except BaseException:
            self._held = False  # unknown: let it expire rather than trust it
            raise
        return self._held

    async def close(self) -> None:
        held, self._held = self._held, False
        if held:
            with contextlib.suppress(Exception):
                await release(self._fetch, self._name, self._holder)

    def sever(self) -> None:
        """Give the lease up without releasing its row (the database is out of reach):
        it expires within its ttl, and `close` no longer tries."""
        self._held = False


@asynccontextmanager
async def lease_exclusive(
    fetch: Fetch, namespace: int, lock_id: int, *, ttl_ms: int = LEASE_TTL_MS
) -> AsyncIterator[bool]:
    """Hold the lease for the block if no other host does; yields whether it is held,
    never waiting. Renewed every third of `ttl_ms` while the block runs."""
    name, holder = lease_name(namespace, lock_id), new_holder()
    held = await take(fetch, name, holder, ttl_ms)
    if not held:
        yield False
        return

    async def renew() -> None:
        while True:
            await asyncio.sleep(ttl_ms / 3000)
            with contextlib.suppress(Exception):  # the next renewal tries again
                await take(fetch, name, holder, ttl_ms)

    renewer = asyncio.get_running_loop().create_task(renew())
    try:
        yield True
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewer
        with contextlib.suppress(Exception):
            await release(fetch, name, holder)


async def take_turn(fetch: Fetch, name: str, holder: str, every_ms: int) -> bool:
    """Whether `holder` takes turn `name` now: True for one host per `every_ms`. The
    last taker keeps the turn while it asks on time; another host takes over once the
    turn has been due for half an interval."""
    params = {"name": name, "holder": holder, "every_ms": every_ms, "grace_ms": every_ms // 2}
    return bool(await fetch("lease_turn", params))


__all__ = ["LEASE_TTL_MS", "LeaseLock", "lease_exclusive", "lease_name", "new_holder", "take_turn"]
