"""Leadership behind a transaction pooler: lease rows instead of session locks.

Through PgBouncer in transaction mode a session advisory lock is taken on whichever
server connection ran that statement, so two hosts both "win" it. Without a
`direct_dsn` the store leads with rows in `cairnqd_leases` (store/postgres/lease.py); with
one, or under a session pooler, it keeps its session locks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest

from cairnqd.store.postgres import PostgresStore
from tests.pooler.conftest import Pooled
from tests.support.waiting import wait_for_async

NAMESPACE = 4242


@pytest.fixture
async def two_hosts(pooled_tx: Pooled) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    a = PostgresStore(pooled_tx.pooled, pooler="transaction", max_size=2)
    b = PostgresStore(pooled_tx.pooled, pooler="transaction", max_size=2)
    await a.connect()
    await b.connect()
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


def test_how_each_set_up_leads(pooled_tx: Pooled) -> None:
    dsn = pooled_tx.pooled
    assert PostgresStore(dsn, pooler="transaction").leadership.mode == "lease"
    direct = PostgresStore(dsn, pooler="transaction", direct_dsn=pooled_tx.direct)
    assert direct.leadership.mode == "session"
    assert direct.session_conninfo is not None and "statement_timeout" not in direct.conninfo
    assert PostgresStore(dsn, pooler="session").leadership.mode == "session"
    assert PostgresStore(dsn).leadership.mode == "session"


async def test_session_locks_would_be_won_twice_through_the_pooler(pooled_tx: Pooled) -> None:
    # The failure the lease rows exist for: two clients, one server connection.
    with (
        psycopg.connect(pooled_tx.pooled, autocommit=True, prepare_threshold=None) as one,
        psycopg.connect(pooled_tx.pooled, autocommit=True, prepare_threshold=None) as two,
    ):
        sql = "select pg_try_advisory_lock(%s, %s)"
        first = one.execute(sql, (NAMESPACE, 9)).fetchone()
        second = two.execute(sql, (NAMESPACE, 9)).fetchone()
    assert first == second == (True,)


async def test_one_leader_of_two_hosts_and_takeover_on_close(
    two_hosts: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two_hosts
    lock_a, lock_b = a.leadership.leader_lock(NAMESPACE, 2), b.leadership.leader_lock(NAMESPACE, 2)
    assert await lock_a.ensure() is True
    assert await lock_b.ensure() is False
    for _ in range(5):  # renewing keeps it; the other keeps being refused
        assert await lock_a.ensure() is True
        assert await lock_b.ensure() is False
    await lock_a.close()
    assert await lock_b.ensure() is True
    assert await lock_a.ensure() is False
    await lock_b.close()


async def test_exclusive_blocks_are_exclusive_across_hosts(
    two_hosts: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two_hosts
    async with a.leadership.exclusive(NAMESPACE, 1) as held:
        assert held
        async with b.leadership.exclusive(NAMESPACE, 1) as other:
            assert not other
    async with b.leadership.exclusive(NAMESPACE, 1) as after:
        assert after  # released at the end of a's block, not when it expires


async def test_the_purge_turn_is_one_host_per_interval_and_sticks(
    two_hosts: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two_hosts
    every_ms = 600
    assert await a.leadership.take_turn("purge:t", every_ms) is True
    assert await b.leadership.take_turn("purge:t", every_ms) is False
    assert await a.leadership.take_turn("purge:t", every_ms) is False  # not due yet, even for a
    # Due again: a, which took the last turn, gets it while b is still refused.
    await wait_for_async("a's next turn", lambda: a.leadership.take_turn("purge:t", every_ms), 10)
    assert await b.leadership.take_turn("purge:t", every_ms) is False
    # a stops asking: once the turn is overdue by half an interval, b takes over.
    await wait_for_async("b's takeover", lambda: b.leadership.take_turn("purge:t", every_ms), 10)
    assert await a.leadership.take_turn("purge:t", every_ms) is False
