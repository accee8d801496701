"""Postgres connections that survive a silent network: keepalives on every connection,
and a deadline on every call so a server that stops answering cannot hang one.

Unit level only: what each connection is opened with, what the kernel applied to its
socket, and calls through a small local proxy that can stop forwarding (the server
looks alive to TCP but never answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from cairnqd.errors import DatabaseUnavailable
from cairnqd.store.base import ClaimDraw
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.postgres.connect import KEEPALIVES, session_conninfo
from tests.support.waiting import wait_for_async

# -- what connections are opened with --------------------------------------------------------


@pytest.mark.parametrize(
    "dsn",
    ["postgresql://app:secret@db.example:5433/tasks", "host=db.example dbname=tasks user=app"],
)
def test_the_conninfo_adds_keepalives(dsn: str) -> None:
    params = psycopg.conninfo.conninfo_to_dict(session_conninfo(dsn))
    for key, value in KEEPALIVES.items():
        assert params[key] == value
    assert params["host"] == "db.example" and params["dbname"] == "tasks"


def test_values_in_the_dsn_win() -> None:
    dsn = "postgresql://db.example/tasks?keepalives_idle=42&tcp_user_timeout=9000"
    params = psycopg.conninfo.conninfo_to_dict(session_conninfo(dsn, statement_timeout_ms=50))
    assert params["keepalives_idle"] == "42"
    assert params["tcp_user_timeout"] == "9000"
    assert params["keepalives_interval"] == KEEPALIVES["keepalives_interval"]
    assert params["options"] == "-c statement_timeout=50"


def test_dead_peers_are_noticed_within_30_seconds() -> None:
    # Idle: probes start after keepalives_idle; tcp_user_timeout closes the connection
    # once unanswered for that long (it overrides keepalives_count on Linux).
    idle_s = int(KEEPALIVES["keepalives_idle"])
    interval_s = int(KEEPALIVES["keepalives_interval"])
    user_timeout_s = int(KEEPALIVES["tcp_user_timeout"]) / 1000
    assert idle_s + interval_s * int(KEEPALIVES["keepalives_count"]) <= 30
    assert user_timeout_s + interval_s <= 30


async def test_every_connection_the_store_opens_gets_them(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[dict[str, Any]] = []
    real_connect = psycopg.AsyncConnection.connect

    async def spy(conninfo: str = "", **kwargs: Any) -> Any:
        opened.append(psycopg.conninfo.conninfo_to_dict(conninfo))
        return await real_connect(conninfo, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", spy)
    store = PostgresStore(pg_dsn, max_size=2)
    async with store:
        await store.submit(name="n")
        await store.claim_wake(["default"], 50)  # the cairnq_queued listener
        await store.task_done_wake("task_x", 50)  # the cairnq_done listener
        async with store.leadership.exclusive(7, 1) as held:  # a leadership session
            assert held
        lock = store.leadership.leader_lock(7, 2)
        assert await lock.ensure()
        await lock.close()
        await store.server_connection_limits()
        for listener in store._listeners.values():
            await listener.until_listening(5)
    # connect's own, the pool's, two listeners, two sessions, the limits check.
    assert len(opened) >= 7
    for params in opened:
        assert {k: params.get(k) for k in KEEPALIVES} == KEEPALIVES


def _socket_options(fd: int) -> dict[str, int]:
    with socket.socket(fileno=os.dup(fd)) as sock:
        return {
            "keepalives": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "keepalives_idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "keepalives_interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "keepalives_count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "tcp_user_timeout": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        }


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="Linux socket options")
async def test_the_kernel_applies_them_to_the_socket(pg_dsn: str) -> None:
    host = psycopg.conninfo.conninfo_to_dict(pg_dsn).get("host", "")
    if str(host).startswith("/"):
        pytest.skip("a Unix socket has no TCP options")
    store = PostgresStore(pg_dsn, max_size=1)
    async with store:
        assert store._pool is not None
        async with store._pool.connection() as conn:
            options = _socket_options(conn.pgconn.socket)
    assert options == {k: int(v) for k, v in KEEPALIVES.items()}


# -- a server that stops answering -----------------------------------------------------------


class SilentProxy:
    """Forwards TCP to Postgres until `silence()`: then held connections stay open but
    nothing more passes either way, and new ones are dropped at once."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def silence(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        if not self._flowing.is_set():
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._writers.append(up_writer)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await src.read(65536):
                await self._flowing.wait()
                dst.write(data)
                await dst.drain()
        dst.close()


@pytest.fixture
async def proxy(pg_dsn: str) -> AsyncIterator[tuple[SilentProxy, str]]:
    params = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    host = str(params.get("host") or "127.0.0.1")
    if host.startswith("/"):
        pytest.skip("the proxy speaks TCP")
    silent = SilentProxy(host, int(params.get("port") or 5432))
    port = await silent.start()
    try:
        yield silent, psycopg.conninfo.make_conninfo(pg_dsn, host="127.0.0.1", port=port)
    finally:
        await silent.close()


CALL_TIMEOUT_S = 1.0
# At its deadline a call's socket is shut: it fails then, not after psycopg's cancel of
# the query over a new connection (5 s here, up to 10 s); this is the scheduling margin.
SHUT_GRACE_S = 3.0
# A call stuck on something other than the database is cancelled a second later.
BACKSTOP_S = 1.0


async def test_a_call_to_a_silent_server_times_out_and_drops_its_connection(
    proxy: tuple[SilentProxy, str],
) -> None:
    silent, dsn = proxy
    store = PostgresStore(dsn, max_size=1, call_timeout_s=CALL_TIMEOUT_S)
    async with store:
        task = await store.submit(name="beat")
        await store.claim(queues=["default"], worker_id="w", lease_ms=60_000)
        silent.silence()
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await store.heartbeat_batch(task_ids=[task.id], worker_id="w")
        took = time.monotonic() - started
        assert CALL_TIMEOUT_S <= took < CALL_TIMEOUT_S + SHUT_GRACE_S, took
        assert store._pool is not None
        assert store._pool.get_stats().get("returns_bad", 0) == 1  # closed, not reused
        silent.resume()
        # The pool replaced it: the next call works on a fresh connection.
        assert await store.heartbeat_batch(task_ids=[task.id], worker_id="w") == {task.id: False}


@pytest.mark.timing
async def test_a_claim_session_past_its_deadline_rolls_back(pg_dsn: str) -> None:
    store = PostgresStore(pg_dsn, max_size=1, call_timeout_s=CALL_TIMEOUT_S)
    async with store:
        task = await store.submit(name="slow.plan")

        async def stalls_after_drawing(draw: ClaimDraw) -> Any:
            drawn = await draw(None, 1)
            assert [row["id"] for row in drawn] == [task.id]
            await asyncio.sleep(60)  # e.g. a wedged caller between statements
            return drawn

        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await store.claim_session(
                queues=["default"], worker_id="w", names=None, plan=stalls_after_drawing
            )
        assert time.monotonic() - started < CALL_TIMEOUT_S + BACKSTOP_S + SHUT_GRACE_S
        assert store._pool is not None
        assert store._pool.get_stats().get("returns_bad", 0) == 1
        # Closing the connection rolled the claim back: the task is still queued.
        again = await store.get(task.id)
        assert again is not None and again.status == "queued" and again.attempt == 0


async def test_leadership_on_a_silent_server_times_out(proxy: tuple[SilentProxy, str]) -> None:
    silent, dsn = proxy
    store = PostgresStore(dsn, max_size=1, call_timeout_s=CALL_TIMEOUT_S)
    async with store:
        lock = store.leadership.leader_lock(7, 2)
        assert await lock.ensure()
        silent.silence()
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await lock.ensure()  # the holding session no longer answers
        assert time.monotonic() - started < CALL_TIMEOUT_S + SHUT_GRACE_S
        await lock.close()
        # Held again, then given up while the server is silent: the unlock keeps the
        # same deadline before the session is closed.
        silent.resume()
        again = store.leadership.leader_lock(7, 2)
        # The first session's lock goes with its backend, once the server sees the
        # closed connection: a moment later on a busy host (CI saw it still held).
        await wait_for_async("the first session's lock to be free", again.ensure)
        silent.silence()
        started = time.monotonic()
        await again.close()
        assert time.monotonic() - started < CALL_TIMEOUT_S + SHUT_GRACE_S


@pytest.mark.timing
async def test_connecting_to_a_server_that_never_answers_fails_in_time() -> None:
    held: list[socket.socket] = []
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    stop = asyncio.Event()

    async def accept_and_ignore() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = await asyncio.to_thread(listener.accept)
                held.append(conn)  # accepted, never answered

    accepting = asyncio.create_task(accept_and_ignore())
    store = PostgresStore(f"host=127.0.0.1 port={port} dbname=x", connect_timeout_s=2)
    started = time.monotonic()
    try:
        with pytest.raises(DatabaseUnavailable):
            await store.connect()
    finally:
        stop.set()
        await accepting
        for conn in held:
            conn.close()
        listener.close()
    assert time.monotonic() - started < 15


def test_call_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="call_timeout_s"):
        PostgresStore("host=db.example", call_timeout_s=0)
    assert PostgresStore("host=db.example", call_timeout_s=None).call_timeout_s is None
