"""`cairnqd fleet` against real daemons on both dialects: a running daemon's row, an older
daemon beside it (its row written as an older release would), the pause that warns
about it and the `--strict` pause that refuses, the gauge, and a clean stop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from cairnqd import __version__
from cairnqd.daemon.wire.messages import PROTOCOL_VERSION
from tests.support.daemon import Daemon
from tests.support.databases import make_store
from tests.support.harness import control_config, gauge, scrape
from tests.support.store import query
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def _fleet(daemon: Any, *args: str) -> dict[str, Any]:
    done = daemon.cli("fleet", "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _older_daemon_joins(dialect: str, target: str) -> None:
    """A daemon of an older release on another host, which honours no pauses."""

    async def join() -> None:
        async with make_store(dialect, target) as store:
            await store.fleet.join(
                "old-host/4242",
                host="old-host",
                pid=4242,
                config="/etc/cairnq.yaml",
                version="0.0.9",
                pipe_protocol=1,
                features=["schedules"],
                groups=["legacy"],
            )

    asyncio.run(join())


def _stamped_since_start(daemon: Any) -> bool:
    [me] = _fleet(daemon)["daemons"]
    return int(me["seen_at_ms"]) > int(me["started_at_ms"])


def test_the_fleet_lists_live_daemons_and_a_pause_names_who_ignores_it(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any, groups: dict[str, Any]
) -> None:
    daemon = daemon_factory(control_config(tmp_path, dialect, db_target, groups)).start()
    fleet = wait_for("the daemon's row", lambda: _fleet(daemon)["daemons"])
    [me] = fleet
    assert me["pid"] == daemon.pid and me["version"] == __version__ and me["live"]
    assert me["groups"] == ["g"] and {"pauses", "schedules", "fleet"} <= set(me["features"])
    assert me["config"] == str(daemon.config_path)

    _older_daemon_joins(dialect, db_target)
    fleet = _fleet(daemon)
    assert sorted(d["version"] for d in fleet["daemons"]) == sorted([__version__, "0.0.9"])
    assert fleet["mixed_versions"] is True
    text = daemon.cli("fleet")
    assert text.returncode == 0 and "old-host/4242" in text.stdout
    [mixed] = [line for line in text.stdout.splitlines() if line.startswith("mixed versions: ")]
    assert f"{__version__} (1)" in mixed and "0.0.9 (1)" in mixed

    strict = daemon.cli("pause", "--queue", "a", "--strict")
    assert strict.returncode == 1, strict.stdout
    assert "refused (--strict)" in strict.stderr and "old-host/4242 (0.0.9)" in strict.stderr
    assert query(dialect, db_target, "select queue from cairnqd_queue_pauses") == []
    paused = daemon.cli("pause", "--queue", "a")
    assert paused.returncode == 0 and "paused a" in paused.stdout
    assert "1 live daemon(s) do not honour pauses" in paused.stderr
    assert "old-host/4242 (0.0.9)" in paused.stderr

    port = daemon.metrics_port()
    assert gauge(scrape(port), "cairnq_fleet_daemons", version="0.0.9") == 1.0
    assert gauge(scrape(port), "cairnq_fleet_daemons", version=__version__) == 1.0
    checked = daemon.cli("check", "--connect")
    assert checked.returncode == 0 and "old-host/4242" in checked.stdout

    assert daemon.stop() == 0
    after = _fleet(daemon, "--all")
    [stopped] = [d for d in after["daemons"] if d["pid"] == daemon.pid]
    assert not stopped["live"] and stopped["stopped_at_ms"] is not None


def test_a_daemon_behind_the_database_says_what_it_cannot_honour(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any, groups: dict[str, Any]
) -> None:
    """The rollback case: the database records a feature a later release brought."""
    config = control_config(tmp_path, "sqlite", sqlite_path, groups)
    first = daemon_factory(config).start()
    assert first.stop() == 0
    assert "does not honour" not in first.output()
    query(
        "sqlite",
        sqlite_path,
        "insert into cairnqd_features (feature, since) "
        "values ('workflows', 'cairnqd_0099_workflows.sql')",
    )
    (tmp_path / "again").mkdir()
    daemon = Daemon(tmp_path / "again", config)
    try:
        daemon.start()
        wait_for("the warning", lambda: "does not honour: workflows" in daemon.output())
        line = next(x for x in daemon.output().splitlines() if "does not honour" in x)
        assert "workflows (since cairnqd_0099_workflows.sql)" in line and __version__ in line
        wait_for("a stamp after the join", lambda: _stamped_since_start(daemon), 30)
        assert daemon.output().count("does not honour: workflows") == 1
    finally:
        assert daemon.stop() == 0


def test_reload_all_refuses_plainly_across_pipe_protocols(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any, groups: dict[str, Any]
) -> None:
    """A running parent of another pipe protocol cannot take children of the installed
    code: `reload --all` says to upgrade (a release that can) or restart (one that
    cannot), and changes nothing."""
    daemon = daemon_factory(control_config(tmp_path, "sqlite", sqlite_path, groups)).start()
    state = daemon.state()
    assert state["version"] == __version__ and state["pipe_protocol"] == PROTOCOL_VERSION
    children = daemon.children()
    (path,) = (daemon.tmp / "run").glob("cairnqd-*.json")
    path.write_text(json.dumps({**state, "version": "0.1.9", "pipe_protocol": 1}))
    refused = daemon.cli("reload", "--all", "--wait", "10s")
    assert refused.returncode == 78, refused.stdout
    assert "pipe protocol 1" in refused.stderr and "upgrade --wait 2m" in refused.stderr
    assert f"cairnqd {__version__} (pipe protocol {PROTOCOL_VERSION})" in refused.stderr
    older = {k: v for k, v in state.items() if k != "upgrade"}
    path.write_text(json.dumps({**older, "version": "0.1.0", "pipe_protocol": 1}))
    refused = daemon.cli("reload", "--all", "--wait", "10s")
    assert refused.returncode == 78, refused.stdout
    assert "restart the daemon instead (systemctl restart cairnqd)" in refused.stderr
    assert daemon.children() == children and daemon.state()["generation"] == 1
    assert daemon.stop() == 0
