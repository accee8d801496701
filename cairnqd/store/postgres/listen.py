"""Postgres push wake-ups: one LISTEN connection per channel, opened on first need, that
proves it hears with a NOTIFY echo (docs/architecture.md, "Deaf LISTEN").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql

from cairnqd.store.postgres.connect import BACKSTOP_S, answer_within

# A LISTEN connection is idle by design, so nothing would ever notice one that a
# partition left half-open if nothing carried data on it: after this long without a
# notification it sends a round trip, which must come back within the second value
# (its socket is then shut, and should that not end the wait, the wait is cancelled a
# second later, as the store's calls are: `answer_within`).
_PING_EVERY_S = 10.0
_PING_TIMEOUT_S = 10.0
#: How long a self-addressed NOTIFY may take to come back before the LISTEN is deaf.
PROBE_TIMEOUT_S = 5.0
#: How often a listener proves again that it hears.
PROBE_EVERY_S = 60.0
#: A NOTIFY sent through another connection: (channel, payload).
SendNotify = Callable[[str, str], Awaitable[None]]

log = logging.getLogger("cairnqd.store")


class _Arrivals:
    """Reads a LISTEN connection's notifications as its socket turns readable, from a
    reader callback that stays registered while the listener waits: per notification,
    one callback and no future, timer or task switch (under a stream of 800 tasks a
    second, one wake-up each). The listener waits here for its next timer, or for the
    connection to break.

    An idle LISTEN waits here rather than in psycopg's `notifies(timeout=...)`, which
    wakes every 100 ms to look for an interrupt: ten turns a second of an idle loop,
    most of an idle worker's CPU on Postgres (bench/RESULTS.md, "Idle cost").
    asyncio holds one reader per socket, and psycopg registers its own while it runs a
    statement on the connection: `pause()` first."""

    def __init__(
        self,
        conn: psycopg.AsyncConnection[object],
        take: Callable[[psycopg.AsyncConnection[object]], None],
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._conn = conn
        self._fd = conn.fileno()
        self._take = take
        self._reading = False
        #: Set with what `take` raised: the connection broke.
        self.broken: asyncio.Future[None] = self._loop.create_future()
        #: Resolved by `nudge()` to end the current wait early.
        self._nudged: asyncio.Future[None] | None = None

    def _readable(self) -> None:
        try:
            self._take(self._conn)
        except Exception as exc:
            self.pause()  # a broken socket stays readable: never spin on it
            if not self.broken.done():
                self.broken.set_exception(exc)

    def pause(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def nudge(self) -> None:
        """End the current wait now: a notification moved the listener's next timer
        (a probe's echo sets the next probe), which the wait's timeout does not know."""
        if self._nudged is not None and not self._nudged.done():
            self._nudged.set_result(None)

    def close(self) -> None:
        """Stop reading; a break nobody waited for is known, not logged as unread."""
        self.pause()
        if self.broken.done() and not self.broken.cancelled():
            self.broken.exception()

    async def wait(self, timeout_s: float) -> None:
        """Dispatch what arrives for up to `timeout_s`; raise what broke the
        connection, if it broke."""
        if self.broken.done():
            self.broken.result()
        if timeout_s <= 0:
            return
        if not self._reading:
            self._reading = True
            self._loop.add_reader(self._fd, self._readable)
            self._take(self._conn)  # anything that came while the reader was off
        self._nudged = self._loop.create_future()
        try:
            await asyncio.wait(
                (self.broken, self._nudged),
                timeout=timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            self._nudged = None
        if self.broken.done():
            self.broken.result()


class _Deaf(Exception):
    """The LISTEN was accepted but its self-addressed NOTIFY never came back."""


#: The sticky key set by every notification on the channel, whatever its payload.
ANY = "\x00any"
#: The most own notifications a listener expects at once (`Listener.expect_own`).
_OWN_MAX = 4096


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
        send_notify: SendNotify | None = None,
        probe_every_s: float = PROBE_EVERY_S,
        on_deaf: Callable[[], None] | None = None,
        on_notify: Callable[[str], None] | None = None,
    ) -> None:
        """`send_notify`: how to send the proving NOTIFY (None: never prove, trust an
        accepted LISTEN); `on_deaf`: called once when the LISTEN turns out deaf;
        `on_notify`: called with every payload (the daemon's relay to its children)."""
        self._on_notify = on_notify
        self._send_notify = send_notify
        self._probe_every_s = probe_every_s
        self._on_deaf = on_deaf
        self._probe_channel = f"cairnqd_probe_{secrets.token_hex(6)}"
        self._probe_token: str | None = None
        self._probe_deadline: float | None = None
        self._next_probe = 0.0
        self._probe_task: asyncio.Task[None] | None = None
        self._arrivals: _Arrivals | None = None
        #: True once a LISTEN was found deaf: push stays off in this listener.
        self.deaf = False
        #: Proving NOTIFYs that came back.
        self.echoes = 0
        self._conninfo = conninfo
        self._connect_kwargs = dict(connect_kwargs or {})
        self._connect_timeout = max(1, int(connect_timeout_s))
        self.channel = channel
        # Payload -> waiters. For cairnq_queued the payload is a queue name and only
        # registered queues are kept, so per-tenant queue names cannot grow this; a
        # wake that arrives while nobody waits stays set until the next wait.
        self._events: dict[str, asyncio.Event] = {}
        self._waiters: dict[str, list[asyncio.Event]] = {}
        # Payloads whose next notification is our own doing: it sets no ANY flag.
        self._own: dict[str, None] = {}
        self._task: asyncio.Task[None] | None = None
        self.disabled = False
        self.connected = asyncio.Event()

    def start(self) -> None:
        if self._task is None and not self.disabled:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        probe, self._probe_task = self._probe_task, None
        if probe is not None:
            probe.cancel()
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

    def expect_own(self, payloads: Sequence[str]) -> None:
        """The next notification of each of `payloads` comes from this process's own
        commit (a task it is settling): it does not set the ANY flag, which is for
        news from elsewhere. Registered before the commit, so a notification that
        arrives before the committing call returns is recognised too. Bounded: the
        oldest expectations go first."""
        for payload in payloads:
            self._own[payload] = None
        while len(self._own) > _OWN_MAX:
            del self._own[next(iter(self._own))]

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
            except Exception as exc:
                if not isinstance(exc, psycopg.Error):
                    log.exception("LISTEN %s could not connect; trying again", self.channel)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            try:
                async with conn:
                    try:
                        await self._subscribe(conn)
                    except psycopg.errors.FeatureNotSupported:
                        self.disabled = True
                        self._release_all()
                        return
                    backoff = 1.0
                    if self._send_notify is None:
                        self.connected.set()  # trusted as accepted
                    else:
                        self._start_probe()  # connected once the echo is heard
                    await self._listen(conn)
            except _Deaf:
                self._turn_deaf()
                return
            except (psycopg.Error, TimeoutError) as exc:
                why = str(exc) or "no answer in time"
                log.info("LISTEN %s dropped (%s); reconnecting", self.channel, why)
            except Exception:
                # Never the end of push wake-ups: a listener that died here would leave
                # its waiters on their polls for good, and nobody would know why.
                log.exception("LISTEN %s failed; reconnecting", self.channel)
            # Dropped: let every waiter fall back to its own poll, then reconnect.
            self.connected.clear()
            self._release_all()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)

    async def _subscribe(self, conn: psycopg.AsyncConnection[object]) -> None:
        """LISTEN on a new session: the proving channel's, then ours. Under the pings'
        deadline: a link cut between the connect and these statements would leave them
        waiting for good, and push wake-ups off until the process ended."""
        async with answer_within(conn, _PING_TIMEOUT_S, backstop_s=BACKSTOP_S):
            if self._send_notify is not None:
                # The private channel first: the session's last statement
                # (pg_stat_activity) stays the LISTEN it is there for.
                probe = sql.SQL("listen {}").format(sql.Identifier(self._probe_channel))
                await conn.execute(probe)
            await conn.execute(sql.SQL("listen {}").format(sql.Identifier(self.channel)))

    async def _listen(self, conn: psycopg.AsyncConnection[object]) -> None:
        """Dispatch notifications until the connection fails its round trip (or its
        proving NOTIFY does not come back: `_Deaf`)."""
        loop = asyncio.get_running_loop()
        next_ping = loop.time() + _PING_EVERY_S
        await self._drain(conn)  # what came in with the LISTEN statements
        arrivals = self._arrivals = _Arrivals(conn, self._take_arrived)
        try:
            while True:
                now = loop.time()
                if self._probe_deadline is not None and now >= self._probe_deadline:
                    arrivals.pause()
                    await self._deaf_or_dead(conn)
                    continue
                probing = self._probe_deadline is not None or self._send_notify is None
                if not probing and now >= self._next_probe:
                    self._start_probe()
                if now >= next_ping:
                    arrivals.pause()
                    async with answer_within(conn, _PING_TIMEOUT_S, backstop_s=BACKSTOP_S):
                        await conn.execute("select 1")
                    next_ping = loop.time() + _PING_EVERY_S
                    await self._drain(conn)  # what came in during the round trip
                    continue
                wake_at = next_ping
                if self._probe_deadline is not None:
                    wake_at = min(wake_at, self._probe_deadline)
                elif self._send_notify is not None:
                    wake_at = min(wake_at, self._next_probe)
                await arrivals.wait(wake_at - loop.time())
        finally:
            self._arrivals = None
            arrivals.close()

    def _take_arrived(self, conn: psycopg.AsyncConnection[object]) -> None:
        """Read what the socket holds and pass its notifications on, without a turn of
        the loop (`notifies()` would wait once more before reading). A connection that
        broke raises here, as a wait would."""
        pgconn = conn.pgconn
        pgconn.consume_input()
        encoding = conn.info.encoding
        while (note := pgconn.notifies()) is not None:
            self._note(note.relname.decode(encoding), note.extra.decode(encoding))

    async def _drain(self, conn: psycopg.AsyncConnection[object]) -> None:
        """Pass on the notifications psycopg kept while a statement ran."""
        async for note in conn.notifies(timeout=0.0):
            self._note(note.channel, note.payload)

    def _note(self, channel: str, payload: str) -> None:
        if channel == self._probe_channel:
            self._heard(payload)
        else:
            self._dispatch(payload)

    async def _deaf_or_dead(self, conn: psycopg.AsyncConnection[object]) -> None:
        """The proving NOTIFY did not come back. A session that a network partition
        swallowed hears nothing either, and is not deaf but dead: only a session that
        still answers a round trip is deaf (`_Deaf`). A silent one fails the round trip
        (TimeoutError once `answer_within` shut it, or psycopg.Error) and is replaced
        like any dropped connection."""
        async with answer_within(conn, _PING_TIMEOUT_S, backstop_s=BACKSTOP_S):
            await conn.execute("select 1")
        async for note in conn.notifies(timeout=0.05):  # an echo that came in meanwhile
            self._note(note.channel, note.payload)
        if self._probe_deadline is not None:
            raise _Deaf()

    def _start_probe(self) -> None:
        """Send a NOTIFY to our private channel through another connection; `_listen`
        expects it back by `_probe_deadline`."""
        loop = asyncio.get_running_loop()
        token = self._probe_token = secrets.token_hex(8)
        self._probe_deadline = loop.time() + PROBE_TIMEOUT_S
        self._probe_task = loop.create_task(self._send_probe(token))

    async def _send_probe(self, token: str) -> None:
        assert self._send_notify is not None
        try:
            await self._send_notify(self._probe_channel, token)
        except Exception as exc:
            # Not sent, so nothing can be concluded: try again a little later.
            log.debug("LISTEN probe on %s not sent: %s", self.channel, exc)
            if self._probe_token == token:
                self._probe_token = self._probe_deadline = None
                self._next_probe = asyncio.get_running_loop().time() + PROBE_TIMEOUT_S
                self._retimed()

    def _heard(self, payload: str) -> None:
        if payload != self._probe_token:
            return
        self._probe_token = self._probe_deadline = None
        self._next_probe = asyncio.get_running_loop().time() + self._probe_every_s
        self.echoes += 1
        self.connected.set()
        self._retimed()

    def _retimed(self) -> None:
        """The probe's timers moved: a wait for the old ones ends, to wait for the new."""
        if self._arrivals is not None:
            self._arrivals.nudge()

    def _turn_deaf(self) -> None:
        self.deaf = self.disabled = True
        self.connected.clear()
        self._release_all()
        log.warning(
            "LISTEN %s is deaf: it was accepted, but a NOTIFY sent to it did not come back "
            "within %.0fs (a transaction pooler on the way? set database.pooler and "
            "database.direct_dsn); push wake-ups are off, polling instead",
            self.channel, PROBE_TIMEOUT_S,
        )  # fmt: skip
        if self._on_deaf is not None:
            self._on_deaf()

    def _dispatch(self, payload: str) -> None:
        if self._on_notify is not None:
            self._on_notify(payload)
        event = self._events.get(payload)
        if event is not None:
            event.set()
        heard = self._events.get(ANY)
        if payload in self._own:
            del self._own[payload]
        elif heard is not None:
            heard.set()
        for waiter in self._waiters.get(payload, ()):
            waiter.set()


class RelayedWakes:
    """Wake-ups passed on by another process instead of a LISTEN of our own: a daemon
    child's, whose parent holds the host's one LISTEN on `direct_dsn` and sends it a
    `wake` message per notification (daemon/parent/wakerelay.py). The same surface as a
    `Listener` where `claim_wake` uses one. Always "listening": a wake lost while the
    parent reconnects costs the child one poll interval, as with a LISTEN of its own."""

    disabled = False
    deaf = False

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self.connected = asyncio.Event()
        self.connected.set()

    def start(self) -> None:
        return None

    async def until_listening(self, timeout_s: float) -> bool:
        return True

    def sticky(self, keys: Sequence[str]) -> list[asyncio.Event]:
        return [self._events.setdefault(k, asyncio.Event()) for k in keys]

    def wake(self, keys: Sequence[str]) -> None:
        for key in keys:
            event = self._events.get(key)
            if event is not None:
                event.set()

    async def stop(self) -> None:
        for event in self._events.values():
            event.set()


__all__ = ["Listener", "RelayedWakes"]
