"""A SQLite database with something in every table `cairnqd move-to` copies, and the
row-by-row comparison of its tables with a Postgres copy (tests/move/).

The source is written through the store (tasks in every status, keys under every
conflict mode, attempts, a pause, schedule state, a limit override) and, for the
tables only a running daemon writes, with plain SQL on the file.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from cairnqd.store.arguments import SubmitRequest
from cairnqd.store.sqlite import SQLiteStore
from cairnqd.store.tables.schedules import ScheduleTable

#: The schedule the source holds, mid-way: its last slot is a minute back.
SCHEDULE = "nightly"
SCHEDULE_RULE = "every 60s"


@dataclass
class Source:
    """What `populate` made, for the assertions."""

    path: str
    ids: dict[str, list[str]] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    running: list[str] = field(default_factory=list)
    last_slot_ms: int = 0


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _populate(path: str, bulk: int) -> Source:
    made = Source(path)
    store = SQLiteStore(path)
    await store.connect()
    try:

        async def submit(name: str, payload: Any, **kw: Any) -> Any:
            return await store.submit(name=name, payload=payload, **kw)

        queued = [(await submit("job.queued", {"n": i}, queue="a")).id for i in range(3)]
        made.ids["queued"] = queued
        later = await submit("job.later", {"at": "later"}, queue="b", delay_ms=3_600_000)
        made.ids["delayed"] = [later.id]
        for mode in ("reuse", "reuse-succeeded", "reject", "replace"):
            key = f"key-{mode}"
            task = await submit("job.keyed", {"mode": mode}, key=key, conflict=mode, queue="a")
            made.keys[mode] = task.id
        done = await submit(
            "job.done", {"x": [1, 2.5, "é"]}, queue="b", priority=5, correlation_id="corr-1"
        )
        failed = await submit("job.bad", None, queue="b", max_attempts=1)
        canceled = await submit("job.cancel", {}, queue="b")
        out = await submit("job.out", {}, queue="c", max_attempts=1)
        again = await submit("job.again", {}, queue="c", max_attempts=3)
        cancel_pending = await submit("job.cancel_pending", {}, queue="c")
        worker = "w-1"
        claimed = await store.claim(queues=["b"], worker_id=worker, limit=10, lease_ms=60_000)
        assert {t.id for t in claimed} == {done.id, failed.id, canceled.id}, claimed
        await store.progress(task_id=done.id, worker_id=worker, progress=0.5, message="half")
        await store.succeed(task_id=done.id, worker_id=worker, result={"ok": True}, message="m")
        await store.fail(
            task_id=failed.id, worker_id=worker, error={"code": "boom", "message": "no"}
        )
        await store.cancel(canceled.id)
        await store.fail(task_id=canceled.id, worker_id=worker, error={"code": "x"})
        made.ids["succeeded"] = [done.id]
        made.ids["failed"] = [failed.id]
        made.ids["canceled"] = [canceled.id]
        # Left running: one out of attempts, one with attempts left, one with a cancel.
        running = await store.claim(queues=["c"], worker_id="w-2", limit=10, lease_ms=600_000)
        assert {t.id for t in running} == {out.id, again.id, cancel_pending.id}, running
        await store.progress(task_id=again.id, worker_id="w-2", progress=0.25, message="a")
        await store.cancel(cancel_pending.id)
        made.running = [out.id, again.id, cancel_pending.id]
        if bulk:
            await store.submit_many(
                [{"name": "job.bulk", "payload": {"i": i}, "queue": "d"} for i in range(bulk)]
            )
        await store.pauses.pause(["b"], paused_by="tester@host", reason="for the move")
        table = ScheduleTable(store)
        now = _now_ms()
        made.last_slot_ms = now - now % 60_000 - 60_000
        await table.ensure(SCHEDULE, SCHEDULE_RULE, made.last_slot_ms - 60_000)
        request = SubmitRequest(name="job.nightly", queue="a", key=f"{SCHEDULE}:slot")
        fired = await table.fire(SCHEDULE, made.last_slot_ms, request, host="h1", at_ms=now)
        assert fired is not None
        await store.limit_table.set(
            "mail-rate", concurrency=3, rate=None, set_by="tester", reason="slow"
        )
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        now = _now_ms()
        conn.execute(
            "insert into cairnqd_interruptions (task_id, given, updated_at_ms) values (?, 1, ?)",
            (again.id, now),
        )
        conn.execute(
            "insert into cairnqd_limit_slots (limit_name, part, kind, slot, until_ms, task_id, "
            "worker_id, attempt) values ('mail-rate', '', 'concurrency', 0, ?, ?, 'w-2', 1)",
            (now + 60_000, again.id),
        )
        conn.execute(
            "insert into cairnqd_limit_bypasses (limit_name, task_id, worker_id, name, queue, "
            "seen_at_ms) values ('mail-rate', ?, 'w-2', 'job.again', 'c', ?)",
            (again.id, now),
        )
        conn.execute(
            "insert into cairnqd_queue_counts (width_s, start_ms, queue, series, bucket, n) "
            "values (60, ?, 'b', 'succeeded', 0, 7)",
            (now - now % 60_000,),
        )
        conn.execute(
            "insert into cairnqd_fleet (daemon, host, pid, config, version, pipe_protocol, "
            "features, groups, started_at_ms, seen_at_ms, stopped_at_ms) values "
            "('old', 'h1', 1, '/etc/c.yaml', '0.1', 1, '[]', '[]', ?, ?, ?)",
            (now - 10_000, now - 5_000, now - 5_000),
        )
    return made


def populate(path: str, *, bulk: int = 0) -> Source:
    """A migrated SQLite database at `path` holding a bit of everything (and `bulk`
    more queued tasks in queue d)."""
    return asyncio.run(_populate(path, bulk))


def add_bulk(path: str, count: int) -> None:
    async def go() -> None:
        store = SQLiteStore(path)
        await store.connect()
        try:
            await store.submit_many(
                [{"name": "job.bulk", "payload": {"i": i}, "queue": "d"} for i in range(count)]
            )
        finally:
            await store.close()

    asyncio.run(go())


# -- comparing ------------------------------------------------------------------------


def _normal(value: Any, json_column: bool) -> Any:
    if json_column and isinstance(value, str):
        return json.loads(value)
    return value


def sqlite_rows(path: str, table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Every row of `table` by primary key, as column -> value."""
    with sqlite3.connect(path) as conn:
        info = conn.execute(f"pragma table_info({table})").fetchall()
        columns = [r[1] for r in info]
        key = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
        rows = conn.execute(f"select * from {table}").fetchall()
    out = {}
    for row in rows:
        mapping = dict(zip(columns, row, strict=True))
        out[tuple(mapping[k] for k in key)] = mapping
    return out


def pg_rows(
    dsn: str, table: str, key: list[str]
) -> tuple[dict[tuple[Any, ...], dict[str, Any]], set[str]]:
    """Every row of `table` by `key`, and the names of its jsonb columns."""
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"select * from {table}")  # type: ignore[arg-type]
        columns = [d.name for d in cur.description or ()]
        rows = cur.fetchall()
        jsonb = {
            r[0]
            for r in conn.execute(
                "select column_name from information_schema.columns "
                "where table_name = %s and data_type = 'jsonb'",
                (table,),
            )
        }
    out = {}
    for row in rows:
        mapping = dict(zip(columns, row, strict=True))
        out[tuple(mapping[k] for k in key)] = mapping
    return out, jsonb


def differences(
    path: str, dsn: str, table: str, *, except_ids: frozenset[str] = frozenset()
) -> list[str]:
    """Each way the Postgres copy of `table` differs from the SQLite one, rows whose
    first key column is in `except_ids` left out."""
    source = sqlite_rows(path, table)
    with sqlite3.connect(path) as conn:
        info = conn.execute(f"pragma table_info({table})").fetchall()
        key = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
    target, jsonb = pg_rows(dsn, table, key)
    found = []
    for k, row in source.items():
        if k[0] in except_ids:
            continue
        other = target.get(k)
        if other is None:
            found.append(f"{table} {k}: missing on the target")
            continue
        for column, value in row.items():
            if _normal(value, column in jsonb) != other[column]:
                found.append(f"{table} {k} {column}: {value!r} != {other[column]!r}")
    for k in target:
        if k not in source:
            found.append(f"{table} {k}: only on the target")
    return found
