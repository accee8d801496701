"""Writing through the caller's own `sqlite3.Connection` (`submit(tx=conn)`).

The task commits or rolls back with the caller's transaction; this module never
commits or rolls back what the caller opened. Where statements must land together
(a keyed submit, `submit_many`) they run under a savepoint, so a failure among them
(a `reject` conflict) undoes only them and leaves the caller's transaction usable.
A connection with no transaction open is given one, as `sqlite3` itself would for a
write: `BEGIN IMMEDIATE`, left open for the caller's `commit()`. In autocommit mode
(`isolation_level=None`) the submit is a transaction of its own.
"""

from __future__ import annotations

import os
import sqlite3
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from cairnqd.store.base import Clock
from cairnqd.store.executor import Session
from cairnqd.store.sqlite.files import is_memory
from cairnqd.store.sqlite.statements import SQLiteSession

_SAVEPOINT = "cairnq_submit"


#: Connections found on the store's file lately, by id (held, so an id is not reused
#: while it is here): the check is a pragma and two stats, worth skipping on a hot path.
_checked: OrderedDict[int, tuple[sqlite3.Connection, str]] = OrderedDict()
_CHECKED_MAX = 32


def check_connection(conn: sqlite3.Connection, path: str) -> None:
    """ValueError unless `conn` is open on the store's database file at `path`."""
    if is_memory(path):
        raise ValueError(
            f"tx= cannot be used with the in-memory store {path!r}: no other connection "
            "can open its database"
        )
    try:
        conn.total_changes  # noqa: B018 - raises on a closed connection
    except sqlite3.ProgrammingError as exc:
        raise ValueError(f"tx= is a closed sqlite3.Connection ({exc})") from None
    cached = _checked.get(id(conn))
    if cached is not None and cached[0] is conn and cached[1] == path:
        _checked.move_to_end(id(conn))
        return
    rows = conn.execute("pragma database_list").fetchall()
    given = next((row[2] for row in rows if row[1] == "main"), "")
    if not given or not _same_file(given, path):
        raise ValueError(
            f"tx= is a sqlite3.Connection on {given or 'an in-memory database'!r}, not "
            f"on this store's database {path!r}: the task would not commit with your work"
        )
    _checked[id(conn)] = (conn, path)
    while len(_checked) > _CHECKED_MAX:
        _checked.popitem(last=False)


def _same_file(a: str, b: str) -> bool:
    try:
        first, second = os.stat(a), os.stat(b.removeprefix("file:").split("?", 1)[0])
    except OSError:
        return False
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def plain_session(conn: sqlite3.Connection, path: str, clock: Clock) -> Session:
    """A session for one statement, atomic by itself: no savepoint. In autocommit mode
    the statement commits on its own."""
    check_connection(conn, path)
    if not conn.in_transaction and conn.isolation_level is not None:
        # What sqlite3 would do before the caller's next write; the caller commits it.
        conn.execute("begin immediate")
    return SQLiteSession(conn, clock)


@asynccontextmanager
async def caller_session(
    conn: sqlite3.Connection, path: str, clock: Clock
) -> AsyncIterator[Session]:
    """A session for statements that must land together."""
    autocommit = conn.isolation_level is None and not conn.in_transaction
    session = plain_session(conn, path, clock)
    if autocommit:
        # Nothing of the caller's to join: the submit is a transaction of its own.
        conn.execute("begin immediate")
        try:
            yield session
        except BaseException:
            conn.execute("rollback")
            raise
        conn.execute("commit")
        return
    conn.execute(f"savepoint {_SAVEPOINT}")
    try:
        yield session
    except BaseException:
        conn.execute(f"rollback to {_SAVEPOINT}")
        conn.execute(f"release {_SAVEPOINT}")
        raise
    conn.execute(f"release {_SAVEPOINT}")
