"""Rows another client wrote that this runtime cannot decode, for the suites that show them.

`BadRow` describes such a row column by column, `SQLITE_BAD` and `POSTGRES_BAD` name the
ones each database accepts and Python refuses, and `insert_bad` writes one with plain
SQL beside the store (priority `BAD_PRIORITY`, so a claim draws it first), as another
SDK or a script would.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass

import psycopg
import pytest

BAD_PRIORITY = 10  # drawn before the good tasks (priority 0): first in the first batch


def nested(depth: int) -> str:
    """JSON text of `depth` empty arrays, one inside the other."""
    return "[" * depth + "]" * depth


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class BadRow:
    """A row written by another client: SQL text for each column that is odd."""

    column: str  # the column the runtime cannot decode
    id: str | bytes = "task_bad"
    name: str | bytes = "odd"
    payload: str | bytes = "{}"
    metadata: str | bytes = "{}"


# SQLite: bytes are bound as text cast from a blob, so they are stored as they are.
SQLITE_BAD = {
    "payload-not-utf8": BadRow("payload", payload=b'{"a":"\xff"}'),
    "metadata-not-utf8": BadRow("metadata", metadata=b'{"m":"\xfe\xff"}'),
    "name-not-utf8": BadRow("name", name=b"odd\xffname"),
    "id-not-utf8": BadRow("id", id=b"task_\xffbad"),
    "payload-huge-number": BadRow("payload", payload='{"n": 1' + "0" * 5000 + "}"),
    "payload-1500-deep": BadRow("payload", payload=nested(1500)),
}
# Postgres holds valid UTF-8 text only: what its jsonb takes and Python refuses.
POSTGRES_BAD = {
    "payload-5000-deep": BadRow("payload", payload=nested(5000)),
    "metadata-5000-deep": BadRow("metadata", metadata='{"m": ' + nested(5000) + "}"),
    "payload-huge-number": BadRow("payload", payload='{"n": 1' + "0" * 5000 + "}"),
}


def bad_row_for_reads(dialect: str) -> BadRow:
    """The row the CLI and dashboard read tests show: on SQLite a name and payload that
    are not UTF-8, on Postgres a payload nested 5,000 levels."""
    if dialect == "sqlite":
        return BadRow("name", name=b"odd\xffname", payload=b'{"a":"\xff"}')
    return BadRow("payload", payload=nested(5000))


def insert_bad(dialect: str, target: str, row: BadRow) -> None:
    now = now_ms()
    values = [row.id, row.name, row.payload, row.metadata, BAD_PRIORITY, now - 1000, now, now]
    if dialect == "sqlite":
        with closing(sqlite3.connect(target)) as conn:
            valid = conn.execute("select json_valid(cast(? as text))", (row.payload,)).fetchone()
            if not valid[0]:
                pytest.skip("this SQLite refuses that JSON itself")
            conn.execute(
                "insert into cairnq_tasks (id, name, queue, status, payload, metadata, attempt,"
                " max_attempts, priority, run_at_ms, created_at_ms, updated_at_ms) values"
                " (cast(? as text), cast(? as text), 'default', 'queued', cast(? as text),"
                " cast(? as text), 0, 3, ?, ?, ?, ?)",
                values,
            )
            conn.commit()
        return
    with psycopg.connect(target, autocommit=True) as pg:
        pg.execute(
            "insert into cairnq_tasks (id, name, queue, status, payload, metadata, attempt,"
            " max_attempts, priority, run_at_ms, created_at_ms, updated_at_ms) values"
            " (%s, %s, 'default', 'queued', %s::jsonb, %s::jsonb, 0, 3, %s, %s, %s, %s)",
            values,
        )
