"""Leadership on Postgres: `pg_try_advisory_lock(namespace, lock_id)` on a session of its
own, never a pool connection and never waiting; or, behind a transaction pooler without
`direct_dsn`, the lease rows of store/postgres/lease.py (`PostgresLeadership`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import psycopg

from cairnqd._protocol import statement
from cairnqd.store.leadership import LeaderLock
from cairnqd.store.postgres.connect import (
    BACKSTOP_S,
    AsyncConn,
    answer_within,
    run,
    shut_socket,
)
from cairnqd.store.postgres.lease import Fetch as LeaseFetch
from cairnqd.store.postgres.lease import LeaseLock, lease_exclusive, take_turn

OpenSession = Callable[[], Awaitable[AsyncConn]]


def _params(key: tuple[int, int]) -> dict[str, int]:
    return {"lock_namespace": key[0], "lock_id": key[1]}


@asynccontextmanager
async def session_lock(
    open_session: OpenSession, namespace: int, lock_id: int, *, timeout_s: float | None
) -> AsyncIterator[bool]:
    """Try the lock on a new session and hold it for the block; yields whether it was
    taken (False: another session has it, so skip the work)."""
    params = _params((namespace, lock_id))
    async with await open_session() as conn:
        async with asyncio.timeout(timeout_s):
            rows = await run(conn, statement("postgres", "try_session_lock"), params)
        held = bool(rows and rows[0]["locked"])
        try:
            yield held
        finally:
            if held and not conn.closed:
                # Best effort: closing the session releases the lock in any case.
                with contextlib.suppress(psycopg.Error, TimeoutError):
                    async with asyncio.timeout(timeout_s):
                        release = statement("postgres", "release_session_lock")
                        await run(conn, release, params)


class HeldSessionLock:
    """The lock kept for as long as its own session lives: leadership that lasts until
    the holder closes it or its connection dies, when Postgres frees the lock for the
    next host that asks.

    `ensure()` proves a held lock's session is still alive (a session lock cannot be
    lost any other way: only its own session can unlock it), or tries to take the lock
    when not held. Any failure closes the session, so "held" never outlives the session
    that took it. Not thread-safe: use it from one event loop.
    """

    def __init__(
        self, open_session: OpenSession, namespace: int, lock_id: int, *, timeout_s: float | None
    ) -> None:
        self._open_session = open_session
        self._timeout_s = timeout_s
        self.key = (namespace, lock_id)
        self._conn: AsyncConn | None = None
        self._held = False
        self._severed = False

    async def ensure(self) -> bool:
        """Whether this session holds the lock now; never waits for the lock. Raises
        (with the session closed) when the database cannot be reached."""
        # The session's round trips shut its socket at the deadline (`answer_within`):
        # a cancel would first ask the server, over a new connection, for up to ~10 s.
        # Opening a session has its own connect timeout; the backstop covers the rest.
        backstop = None if self._timeout_s is None else self._timeout_s + BACKSTOP_S
        try:
            async with asyncio.timeout(backstop):
                held = await self._check_or_take()
        except BaseException:
            # Also on cancellation (a timed-out caller): the lock may have been taken
            # with its answer lost, and closing the session is the one sure release.
            await self._drop()
            raise
        self._held = held
        return held

    async def _check_or_take(self) -> bool:
        if self._held and self._conn is not None:
            try:
                # A round trip on the holding session; no lock call, as a second
                # pg_try_advisory_lock would stack another hold on this one.
                async with self._answered(self._conn):
                    await self._conn.execute("select 1")
                return True
            except psycopg.Error:
                await self._drop()  # the session is gone, and the lock with it
        if self._conn is None or self._conn.closed:
            if self._severed:
                raise psycopg.OperationalError("the leader lock's session was severed")
            self._conn = await self._open_session()
        async with self._answered(self._conn):
            take = statement("postgres", "try_session_lock")
            rows = await run(self._conn, take, _params(self.key))
        return bool(rows and rows[0]["locked"])

    def _answered(self, conn: AsyncConn) -> AbstractAsyncContextManager[None]:
        """The session's round trip must answer within the lock's timeout, if any."""
        if self._timeout_s is None:
            return contextlib.nullcontext()
        return answer_within(conn, self._timeout_s)

    async def close(self) -> None:
        """Give the lock up and end the session. Idempotent."""
        await self._drop(unlock=True)

    def sever(self) -> None:
        """Shut the session's socket (`shut_socket`): a call on it fails at once, and
        `close` then gives up at once too, where a timed-out unlock would have waited
        for psycopg's cancel of it. A severed lock opens no new session."""
        self._severed = True
        if self._conn is not None:
            shut_socket(self._conn)

    async def _drop(self, *, unlock: bool = False) -> None:
        conn, self._conn, held, self._held = self._conn, None, self._held, False
        if conn is None:
            return
        with contextlib.suppress(psycopg.Error, OSError, TimeoutError):
            if unlock and held and not conn.closed:
                # The server frees a closed session's locks only once its backend has
                # exited, a moment after we hang up; unlocking first lets the next
                # host take over on its very next try.
                async with self._answered(conn):
                    release = statement("postgres", "release_session_lock")
                    await run(conn, release, _params(self.key))
        with contextlib.suppress(psycopg.Error, OSError):
            await conn.close()


__all__ = ["HeldSessionLock", "session_lock"]


class PostgresLeadership:
    """`store.leadership` of a `PostgresStore` (the `Leadership` of
    store/leadership.py): advisory locks on sessions of their own (`mode` "session"),
    or lease rows in `cairnqd_leases` (`mode` "lease")."""

    def __init__(
        self,
        *,
        mode: str,
        open_session: OpenSession,
        lease_fetch: LeaseFetch,
        holder: str,
        timeout_s: float | None,
    ) -> None:
        self.mode = mode
        self._open_session = open_session
        self._lease_fetch = lease_fetch
        self._holder = holder
        self._timeout_s = timeout_s

    def exclusive(self, namespace: int, lock_id: int) -> AbstractAsyncContextManager[bool]:
        """The lock for the block; yields False at once when another host holds it."""
        if self.mode == "lease":
            return lease_exclusive(self._lease_fetch, namespace, lock_id)
        return session_lock(self._open_session, namespace, lock_id, timeout_s=self._timeout_s)

    def leader_lock(self, namespace: int, lock_id: int) -> LeaderLock:
        """The lock kept across calls; nothing is opened until its first `ensure()`."""
        if self.mode == "lease":
            return LeaseLock(self._lease_fetch, namespace, lock_id)
        return HeldSessionLock(self._open_session, namespace, lock_id, timeout_s=self._timeout_s)

    async def take_turn(self, name: str, every_ms: int) -> bool:
        """One host per `every_ms` across the hosts on this database gets True."""
        return await take_turn(self._lease_fetch, name, self._holder, every_ms)
