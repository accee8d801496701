"""Migrations through a pooler: several processes starting at once on a fresh database,
each reaching it only through the pooler (no direct DSN), apply every migration exactly
once. Through a transaction pooler a session advisory lock serializes nothing, so the
index cairnqd_0001 builds concurrently elsewhere is built plainly, in its transaction."""

from __future__ import annotations

import asyncio

import psycopg

from cairnqd.store.postgres import PostgresStore
from tests.pooler.conftest import Pooled


async def test_cold_starts_through_the_pooler_migrate_once(pooled: Pooled) -> None:
    stores = [PostgresStore(pooled.pooled, pooler=pooled.mode) for _ in range(4)]
    try:
        results = await asyncio.gather(*(s.connect() for s in stores), return_exceptions=True)
        assert [r for r in results if isinstance(r, BaseException)] == []
    finally:
        for store in stores:
            await store.close()
    with psycopg.connect(pooled.direct) as conn:
        names = [r[0] for r in conn.execute("select name from cairnqd_migrations")]
        index = conn.execute(
            "select i.indisvalid from pg_index i join pg_class c on c.oid = i.indexrelid "
            "where c.relname = 'cairnqd_task_keys_task_id_idx'"
        ).fetchall()
    assert len(names) == len(set(names)) and "cairnqd_0001_task_keys_task_idx.sql" in names
    assert index == [(True,)]
