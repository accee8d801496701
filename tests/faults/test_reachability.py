"""The pieces that let a process notice a silent database, without a daemon around them."""

from __future__ import annotations

import psycopg
import psycopg_pool

from cairnqd.errors import DatabaseUnavailable, LostLease
from cairnqd.store.pg_connect import (
    CANCEL_GRACE_S,
    DAEMON_CALL_TIMEOUT_S,
    DETECTION_BOUND_S,
    Reachability,
    is_unreachable,
    session_conninfo,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_stated_bound_covers_a_call_and_its_cancel() -> None:
    assert DAEMON_CALL_TIMEOUT_S + CANCEL_GRACE_S <= DETECTION_BOUND_S <= 30


def test_an_outage_starts_at_the_first_failure_and_ends_at_the_next_success() -> None:
    clock = Clock()
    reach = Reachability(clock)
    assert reach.down_since is None and reach.down_for() == 0
    reach.failed(TimeoutError())
    clock.now += 5
    reach.failed(psycopg.OperationalError("connection lost"))
    # The outage is the first failure's: later ones neither restart nor rename it.
    assert reach.down_for() == 5
    assert reach.error == "TimeoutError"
    reach.succeeded()
    assert reach.down_since is None and reach.down_for() == 0


def test_only_a_missing_answer_counts_against_the_database() -> None:
    assert is_unreachable(TimeoutError())
    assert is_unreachable(psycopg_pool.PoolTimeout("no connection"))
    assert is_unreachable(DatabaseUnavailable("cannot connect"))
    assert is_unreachable(psycopg.OperationalError("server closed the connection"))
    # The server answered each of these.
    assert not is_unreachable(psycopg.errors.QueryCanceled("statement timeout"))
    assert not is_unreachable(LostLease("task_1"))
    assert not is_unreachable(ValueError("bad input"))
    reach = Reachability()
    reach.failed(LostLease("task_1"))
    assert reach.down_since is None


def test_every_connection_gets_a_connect_timeout_unless_the_dsn_sets_one() -> None:
    dsn = "postgresql://u@db.example:5432/app"
    params = psycopg.conninfo.conninfo_to_dict(session_conninfo(dsn, connect_timeout_s=7.4))
    assert params["connect_timeout"] == "7"
    # libpq's floor is 2 s.
    params = psycopg.conninfo.conninfo_to_dict(session_conninfo(dsn, connect_timeout_s=0.5))
    assert params["connect_timeout"] == "2"
    given = dsn + "?connect_timeout=3"
    params = psycopg.conninfo.conninfo_to_dict(session_conninfo(given, connect_timeout_s=10))
    assert params["connect_timeout"] == "3"
