"""FaultProxy against the real Postgres and real sockets: each mode does what it says."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from tests.faults.pg_probe import SHORT_KEEPALIVES
from tests.faults.proxy import FaultProxy, Mode
from tests.support.waiting import wait_for


def connect(dsn: str, **params: Any) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(dsn, autocommit=True, **params)


def backend_alive(pid: int, admin_dsn: str) -> bool:
    with connect(admin_dsn) as admin:
        row = admin.execute("select count(*) from pg_stat_activity where pid = %s", [pid])
        return bool((row.fetchone() or (0,))[0] == 1)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    """Threads for queries that are meant to hang; the proxy's stop() ends them."""
    with ThreadPoolExecutor(max_workers=4) as executor:
        yield executor


def test_forward_passes_queries_both_ways(pg_proxy: FaultProxy, pg_dsn: str) -> None:
    with connect(pg_proxy.dsn(pg_dsn)) as conn:
        conn.execute("create table t (n int)")
        conn.execute("insert into t select generate_series(1, 1000)")
        assert conn.execute("select sum(n) from t").fetchone() == (500500,)
        stats = pg_proxy.stats
        assert (stats.accepted, stats.open) == (1, 1)
        assert stats.bytes_up > 0 and stats.bytes_down > 0
    wait_for("the proxy to close the link", lambda: pg_proxy.stats, accept=lambda s: s.open == 0)
    assert pg_proxy.stats.bytes_dropped == 0


@pytest.mark.timing
def test_delay_holds_each_chunk_in_each_direction(pg_proxy: FaultProxy, pg_dsn: str) -> None:
    delay_s = 0.5
    with connect(pg_proxy.dsn(pg_dsn)) as conn:
        pg_proxy.delay(delay_s)
        started = time.monotonic()
        assert conn.execute("select 1").fetchone() == (1,)
        delayed_s = time.monotonic() - started
        pg_proxy.forward()
        started = time.monotonic()
        assert conn.execute("select 1").fetchone() == (1,)
        forwarded_s = time.monotonic() - started
    # The query waits delay_s on the way up and its reply delay_s on the way down.
    assert delayed_s >= 2 * delay_s - 0.01, delayed_s
    # Wide margin: the plain round trip takes milliseconds, the bound is a second.
    assert forwarded_s < 2 * delay_s, forwarded_s


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        # The proxy resets its upstream connections in reset mode and when it stops.
        with contextlib.suppress(ConnectionResetError):
            while data := self.request.recv(65536):
                self.request.sendall(data)


@pytest.fixture
def echo_proxy() -> Iterator[FaultProxy]:
    """A FaultProxy in front of a TCP echo server."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    try:
        with FaultProxy((str(host), int(port))) as proxy:
            yield proxy
    finally:
        server.shutdown()
        server.server_close()


def receive(sock: socket.socket, size: int) -> bytes:
    received = b""
    while len(received) < size and (chunk := sock.recv(size - len(received))):
        received += chunk
    return received


def test_delay_keeps_order_when_switched_back(echo_proxy: FaultProxy) -> None:
    echo_proxy.delay(0.5)
    with socket.create_connection((echo_proxy.host, echo_proxy.port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(b"first")
        wait_for("the proxy to hold the first chunk", lambda: echo_proxy.stats.bytes_held == 5)
        echo_proxy.forward()
        sock.sendall(b"second")  # not delayed, but queued behind "first"
        assert receive(sock, 11) == b"firstsecond"
        assert time.monotonic() - started >= 0.5 - 0.01


def test_blackhole_is_silent_and_kills_open_connections_for_good(
    pg_proxy: FaultProxy, pg_dsn: str, pool: ThreadPoolExecutor
) -> None:
    dsn = pg_proxy.dsn(pg_dsn)
    busy = connect(dsn, **SHORT_KEEPALIVES)
    idle = connect(dsn, **SHORT_KEEPALIVES)
    assert busy.execute("select 1").fetchone() == (1,)
    pg_proxy.blackhole()
    dropped_before = pg_proxy.stats.bytes_dropped
    in_flight: Future[Any] = pool.submit(lambda: busy.execute("select 1").fetchone())
    wait_for(
        "the proxy to swallow the query",
        lambda: pg_proxy.stats.bytes_dropped,
        accept=lambda dropped: dropped > dropped_before,
    )
    # A deliberate wait on a non-event: for 5 s, longer than the ~3 s in which the short
    # keepalives end a connection the kernel sees is dead, the query neither completes
    # nor fails. The proxy's kernel still acknowledges the client (see proxy.py), so no
    # keepalive fires, and no FIN or RST reaches it.
    with pytest.raises(TimeoutError):
        in_flight.result(timeout=5)

    pg_proxy.forward()
    # Healed, yet the old connections stay dead: their bytes are still thrown away.
    dropped_before = pg_proxy.stats.bytes_dropped
    up_before = pg_proxy.stats.bytes_up
    late: Future[Any] = pool.submit(lambda: idle.execute("select 1").fetchone())
    wait_for(
        "the proxy to swallow a query on an old connection",
        lambda: pg_proxy.stats.bytes_dropped,
        accept=lambda dropped: dropped > dropped_before,
    )
    assert pg_proxy.stats.bytes_up == up_before
    assert not late.done() and not in_flight.done()
    with connect(dsn) as fresh:
        assert fresh.execute("select 1").fetchone() == (1,)

    pg_proxy.stop()  # closes everything: the hung queries end in an error
    for query in (in_flight, late):
        with pytest.raises(psycopg.OperationalError):
            query.result(timeout=10)
    busy.close()
    idle.close()


def test_blackhole_leaves_new_connections_hanging(pg_proxy: FaultProxy, pg_dsn: str) -> None:
    pg_proxy.blackhole(new_connections="hang")
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError, match="timeout"):
        connect(pg_proxy.dsn(pg_dsn), connect_timeout=2)
    # libpq's own 2 s timeout ended it: the proxy accepted the connection and never
    # answered, which libpq cannot tell from a partition.
    assert time.monotonic() - started >= 1.9
    assert pg_proxy.stats.accepted == 1
    pg_proxy.forward()
    with connect(pg_proxy.dsn(pg_dsn)) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_blackhole_can_refuse_new_connections(pg_proxy: FaultProxy, pg_dsn: str) -> None:
    pg_proxy.blackhole(new_connections="refuse")
    with pytest.raises(psycopg.OperationalError):
        connect(pg_proxy.dsn(pg_dsn), connect_timeout=20)
    assert pg_proxy.mode is Mode.BLACKHOLE


@pytest.mark.timing
def test_reset_kills_open_connections_both_ways(pg_proxy: FaultProxy, pg_dsn: str) -> None:
    dsn = pg_proxy.dsn(pg_dsn)
    conn = connect(dsn)
    pid = conn.info.backend_pid
    assert conn.execute("select 1").fetchone() == (1,)
    pg_proxy.reset()
    assert pg_proxy.stats.open == 0
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        conn.execute("select 1")
    assert time.monotonic() - started < 5  # at once: an RST, not a timeout
    assert conn.broken
    # The RST reached Postgres too: the backend behind the connection is gone.
    wait_for(f"backend {pid} to exit", lambda: not backend_alive(pid, pg_dsn))

    with pytest.raises(psycopg.OperationalError):
        connect(dsn, connect_timeout=20)
    pg_proxy.forward()
    with connect(dsn) as fresh:
        assert fresh.execute("select 1").fetchone() == (1,)


def test_stop_closes_the_listener(pg_proxy: FaultProxy) -> None:
    address = (pg_proxy.host, pg_proxy.port)
    pg_proxy.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=5).close()
    with pytest.raises(RuntimeError, match="not running"):
        pg_proxy.forward()


def test_delay_rejects_a_negative_delay(pg_proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="at least 0"):
        pg_proxy.delay(-1)


def test_reset_sends_an_rst_not_a_fin(echo_proxy: FaultProxy) -> None:
    with socket.create_connection((echo_proxy.host, echo_proxy.port), timeout=10) as sock:
        sock.sendall(b"ping")
        assert receive(sock, 4) == b"ping"
        echo_proxy.reset()
        # A FIN would read as b"" (end of stream); an RST fails the read.
        with pytest.raises(ConnectionResetError):
            sock.recv(16)


def test_blackhole_sends_neither_data_nor_fin_nor_rst(echo_proxy: FaultProxy) -> None:
    with socket.create_connection((echo_proxy.host, echo_proxy.port), timeout=10) as sock:
        sock.sendall(b"ping")
        assert receive(sock, 4) == b"ping"
        echo_proxy.blackhole()
        sock.sendall(b"lost")
        wait_for("the proxy to drop the bytes", lambda: echo_proxy.stats.bytes_dropped == 4)
        # A bounded wait on a non-event: for 1 s nothing at all arrives, not even an end.
        sock.settimeout(1)
        with pytest.raises(TimeoutError):
            sock.recv(16)


def test_stop_closes_clients_still_waiting_for_their_upstream() -> None:
    """A client whose upstream connect is still pending when the proxy stops is reset,
    not left open for the garbage collector to find (an unclosed-socket warning in a
    later test, and a client that hangs meanwhile)."""
    # An upstream that never completes a connect: a listener with a full backlog.
    upstream = socket.socket()
    upstream.bind(("127.0.0.1", 0))
    upstream.listen(0)
    fillers = []
    host, port = upstream.getsockname()
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect((host, port))
        fillers.append(filler)
    proxy = FaultProxy((host, port)).start()
    clients: list[socket.socket] = []
    try:
        clients += [socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(3)]
        wait_for("the proxy to accept", lambda: proxy.stats.accepted == len(clients))
        proxy.stop()
        for client in clients:
            client.settimeout(10)
            with contextlib.suppress(ConnectionResetError):  # a reset closes it too
                assert client.recv(1) == b""
    finally:
        proxy.stop()  # a no-op once stopped
        for sock in [*clients, *fillers, upstream]:
            sock.close()
