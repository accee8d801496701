"""`submit_many` on Postgres: the pieces of a long list's write.

A long list goes in as chunks inside one transaction, so the server inserts one chunk
while the client checks the next (`PostgresStore._submit_many_overlapped`). The first
keyless chunk is an `insert_many`, whose one row is the database clock reading it
stamped its tasks with; every later keyless chunk is streamed by COPY, stamped with
that same reading: the server reads each column straight from the stream, with no
JSON document to unpack. Whether that is cheaper for the server than `insert_many` is
not settled (one measurement had it 22% cheaper per row, another 11% dearer:
bench/RESULTS.md, session 11); the server is what a long `submit_many` waits on, the
protocol's indexes and notify trigger coming with every row.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from cairnqd._protocol import statement
from cairnqd.store.arguments import Params
from cairnqd.store.base import prepare_items
from cairnqd.store.pg_connect import AsyncConn
from cairnqd.store.statement_params import task_rows

#: A list longer than this is written in chunks; no chunk is longer.
OVERLAP_CHUNK = 500
#: The first chunk: small, so the server starts inserting soon.
FIRST_CHUNK = 100
#: Items `Chunk.prepare` checks between two turns of the loop (~0.2 ms of work).
PREPARE_STEP = 50


@dataclasses.dataclass
class Chunk:
    """Items `:stop` of a `submit_many` list from where the last chunk stopped,
    checked; `keyless` when none has a key (the common case), so the chunk can go in
    as one statement."""

    stop: int
    prepared: list[Params]
    keyless: bool

    @classmethod
    async def prepare(
        cls, items: Sequence[Mapping[str, Any]], ids: Sequence[str], start: int, stop: int
    ) -> Chunk:
        """Check the chunk, yielding to the loop every `PREPARE_STEP` items, so a long
        list never holds the loop for long and the driver can go on with the write in
        flight."""
        stop = min(stop, len(items))
        prepared: list[Params] = []
        for at in range(start, stop, PREPARE_STEP):
            prepared += prepare_items(items, ids, at, min(stop, at + PREPARE_STEP))
            await asyncio.sleep(0)
        keyless = bool(prepared) and all(p["key"] is None for p in prepared)
        return cls(stop, prepared, keyless)


async def copy_tasks(conn: AsyncConn, run: Sequence[Params], now_ms: int) -> None:
    """Stream checked keyless submits into cairnq_tasks (insert_copy.sql), each as
    `insert_task` makes it: queued, created now, due after its delay."""
    async with conn.cursor().copy(statement("postgres", "insert_copy").text) as copy:
        write = copy.write_row
        for row in task_rows(run, now_ms):
            await write((*row, "queued"))


__all__ = ["FIRST_CHUNK", "OVERLAP_CHUNK", "PREPARE_STEP", "Chunk", "copy_tasks"]
