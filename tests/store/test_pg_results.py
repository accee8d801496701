"""`returned_rows`: whether a Postgres statement returned rows, read from its result's
status instead of psycopg's `cursor.description` (which builds a Column per column on
every call): the two must agree on every kind of statement the store runs, in a
pipeline too."""

from __future__ import annotations

import asyncio

import psycopg

from cairnqd.store.postgres.connect import returned_rows

STATEMENTS = [
    "select 1 as a, 'x' as b",
    "select 1 as a where false",  # a query that finds nothing still returns rows
    "select",  # no columns, still a query
    "update probe set n = n + 1",
    "update probe set n = n + 1 where n < 0 returning n",  # RETURNING, no row
    "update probe set n = n + 1 returning n, n * 2 as twice",
    "insert into probe (n) values (7)",
    "insert into probe (n) values (8) returning *",
    "delete from probe where n = 7",
    "create temporary table if not exists other (x int)",
    "set application_name = 'probe'",
    "begin",
    "commit",
]


def test_returned_rows_agrees_with_the_cursor_description(pg_dsn: str) -> None:
    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            await conn.execute("create temporary table probe (n int)")
            await conn.execute("insert into probe (n) values (1)")
            for text in STATEMENTS:
                cursor = await conn.execute(text)
                assert returned_rows(cursor) is (cursor.description is not None), text
            async with conn.pipeline():
                cursors = [await conn.execute(text) for text in STATEMENTS]
            for text, cursor in zip(STATEMENTS, cursors, strict=True):
                assert returned_rows(cursor) is (cursor.description is not None), text
            # Both ways of saying "rows" really were asked for: a query and a RETURNING.
            assert returned_rows(cursors[0]) and returned_rows(cursors[4])
            assert not returned_rows(cursors[3])

    asyncio.run(go())
