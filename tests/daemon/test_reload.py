"""Reloads under the real daemon: what changes, what stays, and what `reload --wait` says.

SQLite only: these exercise the supervisor's bookkeeping, not the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.daemon.daemon import base_config, wait_for
from tests.daemon.test_supervisor import database_section, gauge, scrape

pytestmark = pytest.mark.slow


def config_for(tmp_path: Path, db: str, groups: dict[str, Any]) -> dict[str, Any]:
    return base_config(tmp_path, database_section("sqlite", db), groups)


def test_a_reload_without_changes_keeps_the_generation(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(tmp_path, sqlite_path, {"g": {"queues": ["q"], "processes": 2}})
    daemon = daemon_factory(config).start()
    before = set(daemon.children("g"))
    done = daemon.cli("reload", "--wait", "30s")
    assert done.returncode == 0, done.stderr
    assert "generation 1" in done.stdout
    assert daemon.state()["generation"] == 1
    assert "nothing changed; still generation 1" in daemon.output()
    assert set(daemon.children("g")) == before
    # A hot setting: a new generation, the change logged, no child replaced.
    config["logging"] = {"level": "debug"}
    daemon.write_config(config)
    done = daemon.cli("reload", "--wait", "30s")
    assert done.returncode == 0, done.stderr
    assert daemon.state()["generation"] == 2
    assert "reload: settings applied in place: logging.level" in daemon.output()
    assert gauge(scrape(daemon.metrics_port()), "cairnq_config_generation") == 2.0
    assert set(daemon.children("g")) == before
    assert daemon.stop() == 0


def test_a_shrink_drops_the_removed_slot_s_memory_series(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(tmp_path, sqlite_path, {"g": {"queues": ["q"], "processes": 2}})
    daemon = daemon_factory(config).start()
    port = daemon.metrics_port()

    def rss(slot: str) -> float | None:
        return gauge(scrape(port), "cairnq_child_resident_memory_bytes", group="g", slot=slot)

    wait_for("both slots' memory series", lambda: rss("0") and rss("1"))
    config["groups"]["g"]["processes"] = 1
    daemon.write_config(config)
    done = daemon.cli("reload", "--wait", "30s")
    assert done.returncode == 0, done.stderr
    wait_for("the retired child to exit", lambda: len(daemon.children("g")) == 1)
    wait_for("slot 1's series to go", lambda: rss("1") is None)
    assert rss("0")
    assert daemon.stop() == 0
