"""Fixtures for the interop suite: the public SDK's client and ours on one database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import cairnqd
from tests.support.databases import make_store
from tests.support.store import upstream_client


@pytest.fixture
async def theirs(dialect: str, db_target: str) -> AsyncIterator[Any]:
    """The public SDK's client, connected first: it creates the database."""
    async with upstream_client(dialect, db_target) as client:
        yield client


@pytest.fixture
async def ours(theirs: Any, dialect: str, db_target: str) -> AsyncIterator[cairnqd.CairnQ]:
    """Ours, connected second: it adds cairnqd's own migrations."""
    client = cairnqd.CairnQ(make_store(dialect, db_target))
    await client.connect()
    try:
        yield client
    finally:
        await client.close()
