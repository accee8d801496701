"""`LazyStore`: a store opened on first use, on the event loop that first uses it.

The daemon's parent runs its database duties (lease reaping, purges, the metrics'
`stats` queries) on background threads with loops of their own; a store must be
opened on the loop that uses it, and a failed connect must not stop the process, so
it is opened at the first use and retried at the next one.
"""

from __future__ import annotations

from collections.abc import Callable

from cairnqd.store.base import TaskStore


class LazyStore:
    def __init__(self, factory: Callable[[], TaskStore]) -> None:
        self._factory = factory
        self._store: TaskStore | None = None
        self._connected = False

    @property
    def opened(self) -> bool:
        """Whether a store is open now (`get()` would not connect)."""
        return self._connected

    async def get(self) -> TaskStore:
        """The connected store; connects (again, after a failure) when needed."""
        if self._store is None:
            self._store = self._factory()
        if not self._connected:
            await self._store.connect()
            self._connected = True
        return self._store

    def sever(self) -> int:
        """`TaskStore.sever` of the store, if one was made."""
        return 0 if self._store is None else self._store.sever()

    async def close(self) -> None:
        """Close it if it was opened; the next `get()` opens a new one."""
        store, self._store = self._store, None
        self._connected = False
        if store is not None:
            await store.close()
