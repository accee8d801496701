"""Fixtures for the worker suite (on top of tests/support/databases.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cairnqd.client import CairnQ
from cairnqd.store.base import TaskStore
from tests.support.databases import make_store
from tests.support.worker import ErrorLog


@pytest.fixture
def client(store: TaskStore) -> CairnQ:
    """An API handle on the test's store (the store fixture owns the connection)."""
    return CairnQ(store)


@pytest.fixture
async def second_store(store: TaskStore, dialect: str, db_target: str) -> AsyncIterator[TaskStore]:
    """Another connection (SQLite) or pool (Postgres) on the same database."""
    other = make_store(dialect, db_target)
    await other.connect()
    try:
        yield other
    finally:
        await other.close()


@pytest.fixture
def errors() -> ErrorLog:
    return ErrorLog()
