"""Postgres push wake-ups: one LISTEN connection per channel, opened on first need."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql

# A LISTEN connection is idle by design, so nothing would ever notice one that a
# partition left half-open if nothing carried data on it: after this long without a
# notification it sends a round trip, which must come back within the second value.
_PING_EVERY_S = 10.0
_PING_TIMEOUT_S = 10.0


class Listener:
    """One LISTEN connection for one channel, of its own (never a pool connection).

    A store opens a channel's listener only when something first waits on it: the
    `cairnq_queued` one when a worker first claims, the `cairnq_done` one when a
    caller first waits for a task. So a worker that never waits is not sent a
    notification for every task it completes, and an API process that never claims
    is not sent one for every submit.

    Push is an accelerator only: every waiter also has its poll timeout. Until the
    LISTEN is in place (and after a drop), a wait returns as soon as it is, so the
    caller re-reads the database instead of trusting a channel that may have missed
    the event. A refused LISTEN (e.g. behind a transaction pooler) turns push off
    for good; a dropped connection reconnects with backoff.
    """

    def __init__(
        self,
        conninfo: str,
        channel: str,
        *,
        connect_timeout_s: float,
        connect_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._connect_kwargs = dict(connect_kwargs or {})
        self._connect_timeout = max(1, int(connect_timeout_s))
        self.channel = channel
        # Payload -> waiters. For cairnq_queued the payload is a queue name and only
        # registered queues are kept, so per-tenant queue names cannot grow this; a
        # wake that arrives while nobody waits stays set until the next wait.
        self._events: dict[str, asyncio.Event] = {}
        self._waiters: dict[str, list[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self.disabled = False
        self.connected = asyncio.Event()

    def start(self) -> None:
        if self._task is None and not self.disabled:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._release_all()

    async def until_listening(self, timeout_s: float) -> bool:
        """True if the LISTEN is in place; else waits for it (up to `timeout_s`) and
        returns False, telling the caller to re-read before waiting on a wake."""
        self.start()
        if self.connected.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.connected.wait(), timeout_s)
        return False

    def sticky(self, keys: Sequence[str]) -> list[asyncio.Event]:
        """Wake flags for `keys` that stay set until cleared (claim wake-ups)."""
        return [self._events.setdefault(k, asyncio.Event()) for k in keys]

    async def wait_once(self, key: str, timeout_s: float) -> None:
        """Wait for one notification with payload `key` (a task finishing)."""
        event = asyncio.Event()
        self._waiters.setdefault(key, []).append(event)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_s)
        finally:
            waiters = self._waiters.get(key, [])
            with contextlib.suppress(ValueError):
                waiters.remove(event)
            if not waiters:
                self._waiters.pop(key, None)

    def _release_all(self) -> None:
        for events in self._waiters.values():
            for event in events:
                event.set()
        for event in self._events.values():
            event.set()

    async def _run(self) -> None:
        listen = sql.SQL("listen {}").format(sql.Identifier(self.channel))
        backoff = 1.0
        while True:
            try:
                # The store's conninfo, keepalives included: a LISTEN connection is
                # idle by design, so only keepalives notice its peer has gone.
                conn = await psycopg.AsyncConnection.connect(
                    self._conninfo,
                    autocommit=True,
                    connect_timeout=self._connect_timeout,
                    **self._connect_kwargs,
                )
            except psycopg.Error:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            try:
                async with conn:
                    try:
                        await conn.execute(listen)
                    except psycopg.errors.FeatureNotSupported:
                        self.disabled = True
                        self._release_all()
                        return
                    backoff = 1.0
                    self.connected.set()
                    await self._listen(conn)
            except (psycopg.Error, TimeoutError):
                pass
            # Dropped: let every waiter fall back to its own poll, then reconnect.
            self.connected.clear()
            self._release_all()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)

    async def _listen(self, conn: psycopg.AsyncConnection[object]) -> None:
        """Dispatch notifications until the connection fails its round trip."""
        while True:
            async for note in conn.notifies(timeout=_PING_EVERY_S):
                self._dispatch(note.payload)
            async with asyncio.timeout(_PING_TIMEOUT_S):
                await conn.execute("select 1")

    def _dispatch(self, payload: str) -> None:
        event = self._events.get(payload)
        if event is not None:
            event.set()
        for waiter in self._waiters.get(payload, ()):
            waiter.set()


__all__ = ["Listener"]
