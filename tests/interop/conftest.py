"""Fixtures for the interop suite: the public SDK's client and ours on one database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import cairnq
import pytest

import cairnqd
from tests.support.databases import make_store
from tests.support.store import connect_upstream, pg_url


@pytest.fixture
async def theirs(dialect: str, db_target: str) -> AsyncIterator[Any]:
    """The public SDK's client, connected first: it creates the database."""
    if dialect == "sqlite":
        client = cairnq.CairnQ.sqlite(db_target)
    else:
        client = cairnq.CairnQ.postgres(pg_url(db_target), max_size=4)
    await connect_upstream(client)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def ours(theirs: Any, dialect: str, db_target: str) -> AsyncIterator[cairnqd.CairnQ]:
    """Ours, connected second: it adds cairnqd's own migrations."""
    client = cairnqd.CairnQ(make_store(dialect, db_target))
    await client.connect()
    try:
        yield client
    finally:
        await client.close()
