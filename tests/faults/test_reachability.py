"""The pieces that let a process notice a silent database, without a daemon around them."""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any

import psycopg
import psycopg_pool
import pytest

from cairnqd import CairnQ
from cairnqd.errors import DatabaseUnavailable, LostLease
from cairnqd.store.postgres import PostgresStore
from cairnqd.store.postgres.connect import (
    CANCEL_GRACE_S,
    DAEMON_CALL_TIMEOUT_S,
    DETECTION_BOUND_S,
    Reachability,
    is_unreachable,
    session_conninfo,
)
from cairnqd.store.reachability import FLIGHT_HAND_BACK_S
from tests.faults.proxy import FaultProxy
from tests.support.waiting import wait_for_async
from tests.support.worker import pg_listen_queries


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_stated_bound_covers_a_call_and_its_cancel() -> None:
    hand_back = FLIGHT_HAND_BACK_S  # a claim flight's, on top of the call's deadline
    assert DAEMON_CALL_TIMEOUT_S + hand_back + CANCEL_GRACE_S <= DETECTION_BOUND_S <= 30


def test_an_outage_starts_at_the_first_failure_and_ends_at_the_next_success() -> None:
    clock = Clock()
    reach = Reachability(clock)
    assert reach.down_since is None and reach.down_for() == 0
    reach.failed(TimeoutError())
    clock.now += 5
    reach.failed(psycopg.OperationalError("connection lost"))
    # The outage is the first failure's: later ones neither restart nor rename it.
    assert reach.down_for() == 5
    assert reach.error == "TimeoutError"
    reach.succeeded()
    assert reach.down_since is None and reach.down_for() == 0


def test_only_a_missing_answer_counts_against_the_database() -> None:
    assert is_unreachable(TimeoutError())
    assert is_unreachable(psycopg_pool.PoolTimeout("no connection"))
    assert is_unreachable(DatabaseUnavailable("cannot connect"))
    assert is_unreachable(psycopg.OperationalError("server closed the connection"))
    # The server answered each of these.
    assert not is_unreachable(psycopg.errors.QueryCanceled("statement timeout"))
    assert not is_unreachable(LostLease("task_1"))
    assert not is_unreachable(ValueError("bad input"))
    reach = Reachability()
    reach.failed(LostLease("task_1"))
    assert reach.down_since is None


def test_every_connection_gets_a_connect_timeout_unless_the_dsn_sets_one() -> None:
    dsn = "postgresql://u@db.example:5432/app"
    params = psycopg.conninfo.conninfo_to_dict(session_conninfo(dsn, connect_timeout_s=7.4))
    assert params["connect_timeout"] == "7"
    # libpq's floor is 2 s.
    params = psycopg.conninfo.conninfo_to_dict(session_conninfo(dsn, connect_timeout_s=0.5))
    assert params["connect_timeout"] == "2"
    given = dsn + "?connect_timeout=3"
    params = psycopg.conninfo.conninfo_to_dict(session_conninfo(given, connect_timeout_s=10))
    assert params["connect_timeout"] == "3"


# -- through the fault proxy ------------------------------------------------------------------


def newest_listen_session(dsn: str) -> datetime.datetime | None:
    """When the newest LISTEN session on the test database began (server clock)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "select max(backend_start) from pg_stat_activity"
            " where datname = current_database() and query ilike 'listen%%'"
        ).fetchone()
        return None if row is None else row[0]


def server_now(dsn: str) -> datetime.datetime:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("select now()").fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]


@pytest.mark.timing
@pytest.mark.slow
async def test_a_listen_session_cut_off_before_its_listen_is_replaced(
    pg_proxy: FaultProxy, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link goes dead right after the listener connects, before its LISTEN
    statements: they wait on a silent socket. Without a deadline on them the listener
    waited for good, and the worker never woke by push again."""
    store = PostgresStore(pg_proxy.dsn(pg_dsn), connect_timeout_s=2)
    await store.connect()
    real_connect = psycopg.AsyncConnection.connect
    cut: list[bool] = []

    async def connect_then_cut(*args: Any, **kwargs: Any) -> Any:
        conn = await real_connect(*args, **kwargs)
        if not cut:  # the listener's first connection only
            cut.append(True)
            pg_proxy.blackhole()  # this link is dead for good ...
            pg_proxy.forward()  # ... and the next ones go through
        return conn

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", connect_then_cut)
    try:
        await store.claim_wake(["default"], 10)  # starts the listener
        await wait_for_async("the listener to connect", lambda: bool(cut))
        # 10 s for the LISTEN to answer, its socket shut, a 1 s backoff, a new session.
        await wait_for_async(
            "a LISTEN on cairnq_queued",
            lambda: 'listen "cairnq_queued"' in pg_listen_queries(pg_dsn),
            timeout=60,
        )
    finally:
        await store.close()


@pytest.mark.timing
@pytest.mark.slow
async def test_a_listen_session_a_partition_swallowed_is_replaced(
    pg_proxy: FaultProxy, pg_dsn: str
) -> None:
    store = PostgresStore(pg_proxy.dsn(pg_dsn), connect_timeout_s=2)
    await store.connect()
    try:
        await store.claim_wake(["default"], 10)  # opens the LISTEN session
        await wait_for_async("the LISTEN session", lambda: newest_listen_session(pg_dsn))
        # A blip: the session is dead for good (the proxy never forwards on it again),
        # yet nothing ever fails on an idle socket the kernel keeps acknowledging.
        pg_proxy.blackhole()
        pg_proxy.forward()
        healed = server_now(pg_dsn)
        # Its ping goes unanswered: the listener reconnects (ping every 10 s, 10 s to
        # answer, then its socket is shut, a 1 s backoff).
        await wait_for_async(
            "a new LISTEN session",
            lambda: newest_listen_session(pg_dsn),
            timeout=60,
            accept=lambda started: started is not None and started > healed,
        )
        # And wake-ups flow again: a submit cuts a long wait short.
        async with CairnQ(PostgresStore(pg_dsn)) as direct:
            # (A wake that lands before the wait begins stays set for it: no race.)
            waiting = asyncio.ensure_future(store.claim_wake(["default"], 60_000))
            began = time.monotonic()
            await direct.submit("demo.echo", {})
            await asyncio.wait_for(waiting, 30)
            assert time.monotonic() - began < 10
    finally:
        await store.close()


async def test_sever_cuts_a_call_on_a_silent_connection_short(
    pg_proxy: FaultProxy, pg_dsn: str
) -> None:
    """A call waiting on a server that went silent fails at once when the store severs
    its connections: no server-side cancel over the partition (psycopg's, which a task
    cancelled instead waits up to 10 s for), and the next call gets a fresh connection."""
    store = PostgresStore(pg_proxy.dsn(pg_dsn), call_timeout_s=60)
    await store.connect()
    try:
        await store.stats()  # the pool's connection is open and has answered
        pg_proxy.blackhole()
        stuck = asyncio.ensure_future(store.stats())
        await wait_for_async("the call in flight", lambda: store.sever() == 1, 10)
        began = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="closed the connection"):
            await asyncio.wait_for(stuck, 5)
        assert time.monotonic() - began < 1
        pg_proxy.forward()
        assert (await store.stats()) is not None  # a new connection answers
    finally:
        pg_proxy.forward()
        await store.close()


async def test_sever_cuts_the_lead_and_the_store_short_and_close_is_quick(
    pg_proxy: FaultProxy, pg_dsn: str
) -> None:
    """A stop during a partition: the lead's own session (an advisory lock held on a
    connection of its own, outside the pool) fails at once once severed, where a
    timed-out unlock would wait for psycopg's cancel over the partition; and a store
    severed closes its pool without waiting for a worker's connect to a silent server."""
    store = PostgresStore(pg_proxy.dsn(pg_dsn), call_timeout_s=60, connect_timeout_s=5)
    await store.connect()
    lock = store.leadership.leader_lock(91, 1)
    try:
        assert await lock.ensure()
        pg_proxy.blackhole()
        stuck = asyncio.ensure_future(lock.ensure())
        await asyncio.sleep(0)  # it starts its round trip, which gets no answer
        began = time.monotonic()
        lock.sever()
        store.sever()
        with pytest.raises(psycopg.OperationalError):
            await asyncio.wait_for(stuck, 5)
        await lock.close()
        await store.close()
        assert time.monotonic() - began < 1.5
    finally:
        pg_proxy.forward()
        await lock.close()
        await store.close()
