"""Opening a SQLite store while another client holds the write lock.

Every store opened the file by taking the write lock once per known migration (to see
whether it was applied), so while another process held the lock (a long write, a
migration of its own, an operator's `begin immediate` in the sqlite3 shell) a new
store waited out its busy timeout and failed with "database is locked": a restarted
child, the daemon's statistics collector, `cairnqd stats`. Reads need no write lock in
WAL mode; a store whose schema is current now opens and reads without one.
"""

from __future__ import annotations

import time

from cairnqd.store.sqlite import SQLiteStore
from tests.support.locks import database_locked


async def test_a_current_database_opens_and_reads_while_another_client_writes(
    sqlite_path: str,
) -> None:
    first = SQLiteStore(sqlite_path)
    await first.connect()
    task = await first.submit(name="n", payload={}, queue="q")
    await first.close()
    with database_locked("sqlite", sqlite_path, 30, until_exit=True):
        began = time.monotonic()
        store = SQLiteStore(sqlite_path, busy_timeout_ms=20_000)
        await store.connect()
        try:
            assert (await store.stats())["q"]["queued"] == 1
            found = await store.get(task.id)
            assert found is not None and found.status == "queued"
        finally:
            await store.close()
        # Well inside the busy timeout: nothing waited for the lock.
        assert time.monotonic() - began < 10
