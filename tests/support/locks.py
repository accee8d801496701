"""Another client holding the lock every write needs: SQLite's write lock (`begin
immediate`) or a Postgres `LOCK TABLE cairnq_tasks`, for a set time, from a thread of
its own. The stall tests of the worker and the daemon share it."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator

import psycopg


@contextlib.contextmanager
def database_locked(
    dialect: str, target: str, seconds: float, *, until_exit: bool = False
) -> Iterator[threading.Thread]:
    """Hold the lock every write needs for `seconds`, from another client, in a thread;
    `until_exit`: at most `seconds`, and no longer than the block runs."""
    taken = threading.Event()
    released = threading.Event()

    def hold() -> None:
        if dialect == "sqlite":
            conn = sqlite3.connect(target, isolation_level=None, timeout=30)
            try:
                conn.execute("begin immediate")
                taken.set()
                released.wait(seconds)
                conn.execute("rollback")
            finally:
                conn.close()
            return
        with psycopg.connect(target) as pg:
            pg.execute("lock table cairnq_tasks in access exclusive mode")
            taken.set()
            released.wait(seconds)
            pg.rollback()

    holder = threading.Thread(target=hold, name="lock-holder", daemon=True)
    holder.start()
    assert taken.wait(30), "the lock holder never got the lock"
    try:
        yield holder
    finally:
        if until_exit:
            released.set()
        holder.join(60)


@contextlib.asynccontextmanager
async def database_locked_async(dialect: str, target: str, seconds: float) -> AsyncIterator[None]:
    """`database_locked` for a test on the event loop, which must keep running (the
    worker under test) while the lock is held."""
    held = database_locked(dialect, target, seconds)
    await asyncio.to_thread(held.__enter__)
    try:
        yield
    finally:
        await asyncio.to_thread(held.__exit__, None, None, None)
