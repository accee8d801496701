"""Fixtures for the tests through a real PgBouncer: one per pool mode per module."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.conftest import PgDatabases, require_postgres
from tests.pooler.pgbouncer import PgBouncer


def _bouncer(mode: str) -> Iterator[PgBouncer]:
    require_postgres()
    bouncer = PgBouncer(mode).start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture(scope="module")
def bouncer_transaction() -> Iterator[PgBouncer]:
    yield from _bouncer("transaction")


@pytest.fixture(scope="module")
def bouncer_session() -> Iterator[PgBouncer]:
    yield from _bouncer("session")


@dataclass(frozen=True)
class Pooled:
    """A fresh test database, reached directly and through the pooler."""

    mode: str
    direct: str
    pooled: str
    bouncer: PgBouncer


@pytest.fixture(params=["transaction", "session"])
def pooled(request: pytest.FixtureRequest, pg_databases: PgDatabases) -> Pooled:
    bouncer: PgBouncer = request.getfixturevalue(f"bouncer_{request.param}")
    direct = pg_databases.new()
    return Pooled(request.param, direct, bouncer.dsn(direct), bouncer)


@pytest.fixture
def pooled_tx(pg_databases: PgDatabases, bouncer_transaction: PgBouncer) -> Pooled:
    direct = pg_databases.new()
    return Pooled("transaction", direct, bouncer_transaction.dsn(direct), bouncer_transaction)
