"""A TCP proxy that puts network faults between a client and its server.

A `FaultProxy` listens on a free port and forwards every connection it accepts to one
upstream address (in these tests: Postgres). It runs its own asyncio loop in its own
thread, so sync tests, async tests and daemons running in subprocesses can all connect
through it, and the test thread switches its mode at any time:

- `forward()`: bytes pass through unchanged.
- `delay(s)`: every chunk is held `s` seconds in each direction, order kept.
- `blackhole()`: nothing more is forwarded on any open connection, and no FIN or RST is
  sent either: the bytes that arrive are read and thrown away. New connections are
  accepted and blackholed too (`new_connections="hang"`) or reset at once ("refuse").
- `reset()`: every open connection is closed with an RST both ways; new ones are reset
  as soon as they are accepted.

A switch applies to the connections already open as well as to new ones, and has taken
effect when the call returns. A blackholed connection stays dead after `forward()`, as
a connection does after a real partition heals; only new connections work again.

`FaultProxy(..., client_keepalive=True)` also probes its clients as a Postgres server
does with `tcp_keepalives_idle` and `tcp_user_timeout` set: a client that vanished
(its host cut off) is noticed within a few seconds, and the proxy then resets the
upstream side, so Postgres ends the session and frees its locks as it would for a
client it could see die.

The limit of a proxy in user space: while a blackholed connection is open, the kernel
under the proxy still acknowledges what the client sends, keepalive probes included. So
TCP keepalives and TCP_USER_TIMEOUT on the client never fire here; only a timeout in the
client itself notices. For a partition the kernel can see, cut a host off in
`tests/faults/netns.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import Enum
from typing import Literal

import psycopg
import pytest

from tests.support.databases import PG_DSN, require_postgres

NewConnections = Literal["hang", "refuse"]

# How long the test thread waits for the proxy thread to start, switch or stop; far
# more than any of them takes, so only a wedged proxy hits it.
_CONTROL_TIMEOUT_S = 10.0
_CHUNK_BYTES = 65536
# SO_LINGER on with a zero timeout: close() then sends an RST instead of a FIN.
_LINGER_RST = struct.pack("ii", 1, 0)
# With `client_keepalive`: probe after 2 s idle, every 1 s, give up after 3 unanswered
# or 5 s of unacknowledged data, whichever comes first.
_CLIENT_KEEPALIVE = (
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 2),
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3),
    (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 5000),
)


class Mode(Enum):
    FORWARD = "forward"
    DELAY = "delay"
    BLACKHOLE = "blackhole"
    RESET = "reset"


@dataclass(frozen=True)
class _Setting:
    mode: Mode
    delay_s: float = 0.0
    new_connections: NewConnections = "hang"


@dataclass
class ProxyStats:
    """Counters since the proxy started; `FaultProxy.stats` hands out a copy."""

    accepted: int = 0
    open: int = 0  # links the proxy still holds, blackholed ones included
    bytes_up: int = 0  # client -> upstream, forwarded
    bytes_down: int = 0  # upstream -> client, forwarded
    bytes_dropped: int = 0  # read while blackholed and thrown away, both ways
    bytes_held: int = 0  # read and queued, not yet forwarded or dropped (delay mode)


class _Link:
    """One client connection and its upstream connection (none if born blackholed)."""

    def __init__(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None,
    ) -> None:
        self.client_in, self.client = client
        self.upstream_in: asyncio.StreamReader | None = upstream[0] if upstream else None
        self.upstream: asyncio.StreamWriter | None = upstream[1] if upstream else None
        # Once blackholed a link never forwards again, whatever the mode becomes.
        self.severed = upstream is None

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client, self.upstream) if w is not None]

    def reset(self) -> None:
        for writer in self.writers():
            _reset(writer)

    def close(self) -> None:
        for writer in self.writers():
            writer.close()

    async def wait_closed(self) -> None:
        for writer in self.writers():
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    writer.transport.abort()


class FaultProxy:
    """Forwards `listen_host:<free port>` to `upstream`, with switchable faults."""

    def __init__(
        self,
        upstream: tuple[str, int],
        listen_host: str = "127.0.0.1",
        *,
        client_keepalive: bool = False,
    ) -> None:
        self.upstream = upstream
        self.host = listen_host
        self.client_keepalive = client_keepalive
        self.port = 0
        self._setting = _Setting(Mode.FORWARD)
        self._stats = ProxyStats()
        self._links: set[_Link] = set()
        self._serving: set[asyncio.Task[None]] = set()
        # Accepted clients whose serving task has not started yet: stop() resets them
        # (a cancelled task that never ran cannot close its client).
        self._accepted: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)

    # --- control, from the test thread ---

    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(_CONTROL_TIMEOUT_S):
            raise RuntimeError(f"fault proxy to {self.upstream} did not start")
        if self._startup_error is not None:
            raise RuntimeError(
                f"fault proxy could not listen on {self.host}: {self._startup_error}"
            ) from self._startup_error
        return self

    def stop(self) -> None:
        """Close the listener and reset every connection; safe to call twice."""
        if self._loop is not None and self._stopping is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(_CONTROL_TIMEOUT_S)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def forward(self) -> None:
        self._switch(_Setting(Mode.FORWARD))

    def delay(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"delay must be at least 0 seconds, got {seconds}")
        self._switch(_Setting(Mode.DELAY, delay_s=seconds))

    def blackhole(self, new_connections: NewConnections = "hang") -> None:
        if new_connections not in ("hang", "refuse"):
            raise ValueError(f"new_connections must be 'hang' or 'refuse', got {new_connections!r}")
        self._switch(_Setting(Mode.BLACKHOLE, new_connections=new_connections))

    def reset(self) -> None:
        self._switch(_Setting(Mode.RESET))

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def mode(self) -> Mode:
        return self._setting.mode

    @property
    def stats(self) -> ProxyStats:
        return replace(self._stats, open=len(self._links))

    def dsn(self, dsn: str) -> str:
        """`dsn` (URL or key=value) with its host and port pointing at this proxy."""
        return psycopg.conninfo.make_conninfo(dsn, host=self.host, port=str(self.port))

    def _switch(self, setting: _Setting) -> None:
        if self._loop is None or not self._thread.is_alive():
            raise RuntimeError("the fault proxy is not running")
        done = asyncio.run_coroutine_threadsafe(self._apply(setting), self._loop)
        done.result(_CONTROL_TIMEOUT_S)

    # --- the proxy thread ---

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        finally:
            self._ready.set()  # never leave start() waiting, even if the loop died

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        try:
            server = await asyncio.start_server(self._accept, self.host, 0)
        except OSError as exc:
            self._startup_error = exc
            return
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stopping.wait()
        server.close()
        await self._reset_links(set(self._links))
        for task in list(self._serving):
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)
        orphans = [writer for writer in self._accepted if not writer.transport.is_closing()]
        for writer in orphans:
            _reset(writer)
        for writer in orphans:
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        await server.wait_closed()

    async def _apply(self, setting: _Setting) -> None:
        self._setting = setting
        if setting.mode is Mode.BLACKHOLE:
            for link in self._links:
                link.severed = True
        elif setting.mode is Mode.RESET:
            await self._reset_links(set(self._links))

    async def _reset_links(self, links: set[_Link]) -> None:
        for link in links:
            self._links.discard(link)
            link.reset()
        # The sockets close (and the RSTs leave) when the transports report connection
        # lost, one loop turn later: wait for that so reset() returns after the fact.
        for link in links:
            await link.wait_closed()

    def _accept(self, client_in: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        # Our own task rather than a coroutine callback, so that stop() can cancel it
        # without asyncio's stream machinery logging the cancellation as an error.
        self._stats.accepted += 1
        sock = client.get_extra_info("socket")
        if self.client_keepalive and sock is not None:
            try:
                for level, option, value in _CLIENT_KEEPALIVE:
                    sock.setsockopt(level, option, value)
            except OSError:
                # The client is gone already (reset while it was being accepted): an
                # exception here would leave its transport to the garbage collector.
                _reset(client)
                return
        self._accepted.add(client)
        task = asyncio.get_running_loop().create_task(self._serve(client_in, client))
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    async def _serve(self, client_in: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        self._accepted.discard(client)  # from here this task closes it
        try:
            link = await self._connect(client_in, client)
        except BaseException:
            _reset(client)  # stop() cancelled the upstream connect
            raise
        if link is None:
            return
        self._links.add(link)
        try:
            await self._relay(link)
        finally:
            self._links.discard(link)
            link.close()

    async def _connect(
        self, client_in: asyncio.StreamReader, client: asyncio.StreamWriter
    ) -> _Link | None:
        """The link for a new client, or None when it was reset instead."""
        setting = self._setting
        if setting.mode is Mode.RESET or (
            setting.mode is Mode.BLACKHOLE and setting.new_connections == "refuse"
        ):
            _reset(client)
            return None
        if setting.mode is Mode.BLACKHOLE:
            # A partition: the upstream never hears of this connection.
            return _Link((client_in, client), None)
        try:
            upstream = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(client)
            return None
        return _Link((client_in, client), upstream)

    async def _relay(self, link: _Link) -> None:
        if link.upstream_in is None or link.upstream is None:
            await self._pump(link, link.client_in, None, "up")
            return
        await asyncio.gather(
            self._pump(link, link.client_in, link.upstream, "up"),
            self._pump(link, link.upstream_in, link.client, "down"),
        )

    async def _pump(
        self,
        link: _Link,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter | None,
        direction: Literal["up", "down"],
    ) -> None:
        """Read `source` to its end, queueing each chunk (and the end) for `sink`."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        delivery = asyncio.create_task(self._deliver(link, queue, sink, direction))
        try:
            while chunk := await source.read(_CHUNK_BYTES):
                if link.severed:
                    self._stats.bytes_dropped += len(chunk)
                else:
                    queue.put_nowait((loop.time() + self._setting.delay_s, chunk))
                    self._stats.bytes_held += len(chunk)
            # The end travels through the queue too, so a FIN never overtakes data.
            queue.put_nowait((loop.time() + self._setting.delay_s, b""))
            await delivery
        except OSError:
            self._broken(link)
        finally:
            delivery.cancel()
            while not queue.empty():  # undelivered at the end: no longer held
                self._stats.bytes_held -= len(queue.get_nowait()[1])

    async def _deliver(
        self,
        link: _Link,
        queue: asyncio.Queue[tuple[float, bytes]],
        sink: asyncio.StreamWriter | None,
        direction: Literal["up", "down"],
    ) -> None:
        """Write each queued chunk to `sink` once it is due; an empty chunk is the end."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                due, chunk = await queue.get()
                try:
                    await asyncio.sleep(due - loop.time())
                finally:
                    self._stats.bytes_held -= len(chunk)
                if link.severed or sink is None:
                    self._stats.bytes_dropped += len(chunk)
                elif not chunk:
                    sink.write_eof()
                else:
                    sink.write(chunk)
                    await sink.drain()
                    if direction == "up":
                        self._stats.bytes_up += len(chunk)
                    else:
                        self._stats.bytes_down += len(chunk)
                if not chunk:
                    return
        except OSError:
            self._broken(link)

    def _broken(self, link: _Link) -> None:
        """One side failed: pass the reset on, unless the link is blackholed (silent)."""
        if not link.severed:
            link.reset()


def postgres_address() -> tuple[str, int]:
    """Where the test Postgres server (`PG_DSN`) listens."""
    target = psycopg.conninfo.conninfo_to_dict(PG_DSN)
    return str(target.get("host") or "127.0.0.1"), int(str(target.get("port") or 5432))


@contextlib.contextmanager
def proxy_to_postgres(listen_host: str = "127.0.0.1") -> Iterator[FaultProxy]:
    """A started FaultProxy in front of the test Postgres server."""
    with FaultProxy(postgres_address(), listen_host) as proxy:
        yield proxy


@pytest.fixture
def pg_proxy() -> Iterator[FaultProxy]:
    """A FaultProxy to the test Postgres; `pg_proxy.dsn(pg_dsn)` connects through it."""
    require_postgres()
    with proxy_to_postgres() as proxy:
        yield proxy
