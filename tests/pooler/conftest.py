"""Fixtures for the tests through a real PgBouncer: one per pool mode per module."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.pooler.pgbouncer import PgBouncer
from tests.support.daemon import Daemon
from tests.support.databases import PgDatabases, require_postgres


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


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], Daemon]]:
    """Builds `Daemon`s for the test (each in a directory of its own, so two may run
    side by side); stops every one of them afterwards."""
    started: list[Daemon] = []

    def make(config: dict[str, Any]) -> Daemon:
        home = tmp_path / f"daemon{len(started)}"
        home.mkdir()
        config = {**config, "runtime_dir": str(home / "run")}
        daemon = Daemon(home, config)
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        daemon.stop()
