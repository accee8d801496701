"""Fixtures for the protocol tests: one set of throwaway Postgres databases per module."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.protocol.sqldb import PG_DSN, PgDatabases


@pytest.fixture(scope="module")
def pg() -> Iterator[PgDatabases]:
    try:
        dbs = PgDatabases()
    except Exception as exc:
        if os.environ.get("CAIRNQD_REQUIRE_PG") == "1":
            raise
        pytest.skip(f"Postgres unreachable at {PG_DSN}: {exc}")
    try:
        yield dbs
    finally:
        dbs.close()
