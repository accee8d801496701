"""A LISTEN that is accepted but deaf, found by its self-addressed NOTIFY.

Through PgBouncer in transaction mode LISTEN succeeds, and the notifications sent to
it never arrive. The listener proves it hears with a NOTIFY on a private channel,
sent through another connection, at start and every `probe_every_s`: no echo, and
push is turned off with a warning (the waiters poll) instead of silently waiting on
the poll timeout forever.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg
import pytest

from cairnqd.store.postgres import PostgresStore
from cairnqd.store.postgres.listen import PROBE_TIMEOUT_S, Listener
from tests.pooler.conftest import Pooled
from tests.support.waiting import wait_for_async


def notifier(dsn: str) -> Callable[[str, str], Awaitable[None]]:
    async def send(channel: str, payload: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("select pg_notify(%s, %s)", (channel, payload))

    return send


@pytest.fixture
async def listeners() -> AsyncIterator[list[Listener]]:
    made: list[Listener] = []
    yield made
    for listener in made:
        await listener.stop()


async def test_a_listen_through_a_transaction_pooler_is_found_deaf(
    pooled_tx: Pooled, listeners: list[Listener], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cairnqd.store")
    deaf_calls: list[str] = []
    listener = Listener(
        pooled_tx.pooled,
        "cairnq_queued",
        connect_timeout_s=5,
        connect_kwargs={"prepare_threshold": None},
        send_notify=notifier(pooled_tx.direct),
        on_deaf=lambda: deaf_calls.append("deaf"),
    )
    listeners.append(listener)
    wake = listener.sticky(["q"])[0]
    listener.start()
    # Not trusted before the echo: a caller re-reads instead of waiting on it.
    assert await listener.until_listening(0.5) is False
    await wait_for_async("the deaf LISTEN", lambda: listener.deaf, PROBE_TIMEOUT_S + 10)
    assert listener.disabled and not listener.connected.is_set()
    assert deaf_calls == ["deaf"]
    assert wake.is_set()  # waiters were released to their own polls
    warnings = [r.getMessage() for r in caplog.records if "is deaf" in r.getMessage()]
    assert len(warnings) == 1 and "cairnq_queued" in warnings[0]


async def test_a_direct_listen_hears_its_probe_again_and_again(
    pooled_tx: Pooled, listeners: list[Listener]
) -> None:
    listener = Listener(
        pooled_tx.direct,
        "cairnq_queued",
        connect_timeout_s=5,
        send_notify=notifier(pooled_tx.direct),
        probe_every_s=0.2,
    )
    listeners.append(listener)
    wake = listener.sticky(["q"])[0]
    listener.start()
    await wait_for_async("the echo of the first probe", listener.connected.is_set, 15)
    # Several probes later it still hears, and real notifications still arrive. An echo
    # sets the next probe 0.2 s on, and the wait that was running then ends for it: a
    # wait that ran on to the echo's deadline instead spaced the probes 5 s apart.
    await wait_for_async("four echoes", lambda: listener.echoes >= 4, PROBE_TIMEOUT_S)
    assert not listener.deaf and listener.connected.is_set()
    await notifier(pooled_tx.direct)("cairnq_queued", "q")
    await wait_for_async("the wake-up", wake.is_set, 5)


async def test_a_store_reports_push_deaf_and_keeps_working_by_polling(pooled_tx: Pooled) -> None:
    # Declared as a session pooler, but PgBouncer runs in transaction mode: the store
    # LISTENs through it (as it would under a session pooler) and finds out.
    store = PostgresStore(pooled_tx.pooled, pooler="session", max_size=2)
    await store.connect()
    try:
        assert store.push_state == "on"
        for _ in range(3):
            await store.claim_wake(["default"], 200)
        await wait_for_async("push to be found deaf", lambda: store.push_state, 15,
                             accept=lambda s: s == "deaf")  # fmt: skip
        task = await store.submit(name="t", queue="default")
        claimed = await store.claim(queues=["default"], worker_id="w:1", lease_ms=10_000)
        assert [t.id for t in claimed] == [task.id]
        await store.claim_wake(["default"], 50)  # polls: no listener to wait on
    finally:
        await store.close()
