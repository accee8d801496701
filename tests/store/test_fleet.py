"""The fleet registry (`store.fleet`) on both dialects: rows that join, stamp, leave and
age out, and the features the database says it uses."""

from __future__ import annotations

from typing import Any

import pytest

from cairnqd.store.base import TaskStore
from cairnqd.store.tables.fleet import (
    FORGET_MS,
    HONOURED_FEATURES,
    LIVE_MS,
    lacking,
    versions,
)
from tests.support.fleet import fleet_member
from tests.support.store import query


async def _join(store: TaskStore, daemon: str, **kw: Any) -> None:
    args: dict[str, Any] = {
        "host": "h1",
        "pid": 100,
        "config": "/etc/cairnq.yaml",
        "version": "0.2.0",
        "pipe_protocol": 2,
        "features": HONOURED_FEATURES,
        "groups": ["default"],
    }
    await store.fleet.join(daemon, **{**args, **kw})


def _age(dialect: str, target: str, daemon: str, ms: int) -> None:
    """Move `daemon`'s last stamp `ms` into the past, as silence would."""
    query(
        dialect,
        target,
        "update cairnqd_fleet set seen_at_ms = seen_at_ms - ? where daemon = ?",
        [ms, daemon],
    )


async def test_a_daemon_joins_stamps_and_leaves(store: TaskStore) -> None:
    await _join(store, "h1/100")
    [member] = await store.fleet.live()
    assert (member.daemon, member.host, member.pid, member.version) == (
        "h1/100",
        "h1",
        100,
        "0.2.0",
    )
    assert member.features == tuple(sorted(HONOURED_FEATURES))
    assert member.groups == ("default",) and member.live and member.stopped_at_ms is None
    assert 0 <= member.age_ms < 60_000

    assert await store.fleet.beat("h1/100", ["default", "mail"])
    [member] = await store.fleet.live()
    assert member.groups == ("default", "mail")

    await store.fleet.leave("h1/100")
    assert await store.fleet.live() == []
    [gone] = await store.fleet.members()
    assert not gone.live and gone.stopped_at_ms is not None
    # A stopped daemon's stamp is refused: it joins again when it starts again.
    assert not await store.fleet.beat("h1/100", ["default"])
    await _join(store, "h1/100", version="0.3.0")
    [back] = await store.fleet.live()
    assert back.version == "0.3.0" and back.stopped_at_ms is None


async def test_a_silent_daemon_is_not_live_and_is_forgotten_later(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    await _join(store, "h1/100")
    await _join(store, "h2/200", host="h2", pid=200)
    _age(dialect, db_target, "h2/200", LIVE_MS + 1000)
    assert [m.daemon for m in await store.fleet.live()] == ["h1/100"]
    silent = [m for m in await store.fleet.members() if not m.live]
    assert [m.daemon for m in silent] == ["h2/200"] and silent[0].stopped_at_ms is None
    assert await store.fleet.prune() == 0
    _age(dialect, db_target, "h2/200", FORGET_MS)
    assert await store.fleet.prune() == 1
    assert [m.daemon for m in await store.fleet.members()] == ["h1/100"]
    # A forgotten daemon's stamp finds no row, so it joins again.
    assert not await store.fleet.beat("h2/200", [])


async def test_the_database_names_the_features_it_uses(store: TaskStore) -> None:
    features = {f.name: f.since for f in await store.fleet.features()}
    # Counted concurrency is SQLite's way of keeping a limit; Postgres keeps slots.
    sqlite_only = {"limit_counts"} if store.dialect == "postgres" else set()
    assert set(features) == set(HONOURED_FEATURES) - sqlite_only
    if store.dialect == "sqlite":
        assert features["limit_counts"] == "cairnqd_0016_limit_workers.sql"
    assert features["pauses"] == "cairnqd_0002_queue_pauses.sql"


def test_who_lacks_a_feature_and_the_versions_live() -> None:
    members = [
        fleet_member("a", "0.2.0", features=("pauses",)),
        fleet_member("b", "0.1.0", features=()),
        fleet_member("c", "0.1.0", features=(), live=False),  # gone: neither lacking nor counted
        fleet_member("d", "0.2.0", features=("pauses",)),
    ]
    assert [m.daemon for m in lacking(members, "pauses")] == ["b"]
    assert versions(members) == {"0.2.0": 2, "0.1.0": 1}


async def test_a_row_another_tool_wrote_reads_without_failing(
    store: TaskStore, dialect: str, db_target: str
) -> None:
    await _join(store, "h1/100")
    query(dialect, db_target, "update cairnqd_fleet set features = 'not json', groups = '{}'")
    [member] = await store.fleet.live()
    assert member.features == () and member.groups == ()


@pytest.mark.parametrize("bad", [{"daemon": ""}, {"daemon": "x" * 256}, {"pid": -1}])
async def test_bad_rows_are_refused_before_writing(store: TaskStore, bad: dict[str, Any]) -> None:
    bad = dict(bad)  # the parameter is shared by both dialects
    daemon = bad.pop("daemon", "h1/100")
    with pytest.raises(ValueError):
        await _join(store, daemon, **bad)
    assert await store.fleet.members() == []
