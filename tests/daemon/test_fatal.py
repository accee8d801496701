"""FATAL groups, boot crashes and /healthz under the real daemon.

Only a child that cannot boot (exit 78: handler import, config, schema) makes its
group FATAL; a child killed while it boots is a crash like any other. A FATAL group
is tried again after `supervisor.fatal_cooldown`, and /healthz names it meanwhile.
SQLite only: these exercise the supervisor, not the store.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import base_config, healthz
from tests.support.harness import client_call, database_section, gauge, scrape
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

SLOW_BOOT = "tests.daemon.slow_boot_handlers:registry"
FLAKY = "tests.daemon.flaky_handlers:registry"


def config_for(tmp_path: Path, db: str, groups: dict[str, Any]) -> dict[str, Any]:
    return base_config(tmp_path, database_section("sqlite", db), groups)


def break_group(tmp_path: Path, daemon: Any, group: str) -> None:
    """Make FLAKY's module refuse to import, then kill the group's children: their
    replacements cannot boot. (Broken before the start, the daemon would refuse to
    start at all: tests/cli/test_preflight.py.)"""
    doomed = wait_for(f"the children of {group}", lambda: daemon.children(group))
    (tmp_path / "handlers-broken").touch()
    for pid in doomed:
        os.kill(pid, signal.SIGKILL)


def test_kills_during_boot_are_crashes_not_fatal(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(
        tmp_path, sqlite_path, {"g": {"queues": ["q"], "processes": 1, "handlers": [SLOW_BOOT]}}
    )
    daemon = daemon_factory(config).start()
    (first,) = daemon.children("g")
    os.kill(first, signal.SIGKILL)  # its replacement boots: from there on, kill while booting
    killed = {first}
    for _ in range(7):  # more than the five that used to make the group FATAL

        def booting() -> int | None:
            assert daemon.proc is not None
            if daemon.proc.poll() is not None:
                raise AssertionError(f"daemon exited {daemon.proc.returncode}:\n{daemon.output()}")
            found = [p for p, t in daemon.children("g").items() if t.endswith(" starting")]
            return next((p for p in found if p not in killed), None)

        pid = wait_for("a child that is still booting", booting, timeout=30)
        killed.add(pid)
        os.kill(pid, signal.SIGKILL)
    wait_for(
        "a child to boot after the kills",
        lambda: any(t.endswith(" ready") for t in daemon.children("g").values()),
        timeout=60,
    )
    result = client_call("sqlite", sqlite_path, lambda c: c.call("s.echo", 9, queue="q"))
    assert result == 9
    assert daemon.proc is not None and daemon.proc.poll() is None, daemon.output()
    text = scrape(daemon.metrics_port())
    assert gauge(text, "cairnq_group_state", group="g", state="fatal") == 0.0
    assert gauge(text, "cairnq_child_restarts_total", group="g", reason="boot_failure") == 7.0
    assert gauge(text, "cairnq_child_restarts_total", group="g", reason="crash") == 1.0
    assert "FATAL" not in daemon.output()
    assert daemon.stop() == 0


def test_healthz_names_a_fatal_group_and_the_group_comes_back_after_the_cool_down(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(
        tmp_path,
        sqlite_path,
        {"good": {"queues": ["good"]}, "flaky": {"queues": ["flaky"], "handlers": [FLAKY]}},
    )
    config["supervisor"]["fatal_cooldown"] = "3s"
    daemon = daemon_factory(config).start()
    break_group(tmp_path, daemon, "flaky")
    port = daemon.metrics_port()
    wait_for("the FATAL log line", lambda: "group flaky is FATAL" in daemon.output())
    status, body = healthz(port)
    assert status == 503, body
    assert body["status"] == "unhealthy"
    assert body["groups"]["flaky"]["state"] == "fatal"
    assert "handlers-broken exists" in body["groups"]["flaky"]["error"]
    # Where the import broke, as the child reported it.
    assert "tests/daemon/flaky_handlers.py:13: " in body["groups"]["flaky"]["error"]
    assert body["groups"]["good"]["state"] == "running"
    assert any("flaky" in problem and "FATAL" in problem for problem in body["problems"])
    # Mended without a reload: the cool-down retries the group with a fresh budget.
    (tmp_path / "handlers-broken").unlink()
    wait_for("the flaky group to come back", lambda: daemon.children("flaky"), timeout=30)
    result = client_call("sqlite", sqlite_path, lambda c: c.call("f.echo", 3, queue="flaky"))
    assert result == 3
    assert "group flaky: trying again after" in daemon.output()
    wait_for("/healthz to be 200 again", lambda: healthz(port)[0] == 200)
    status, body = healthz(port)
    assert body["status"] == "ok" and body["problems"] == []
    assert body["groups"]["flaky"] == {**body["groups"]["flaky"], "state": "running", "ready": 1}
    assert daemon.stop() == 0


def test_healthz_is_200_with_a_json_body_when_all_is_well(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(tmp_path, sqlite_path, {"g": {"queues": ["q"], "processes": 2}})
    daemon = daemon_factory(config).start()
    status, body = healthz(daemon.metrics_port())
    assert status == 200
    assert body["status"] == "ok" and body["problems"] == []
    assert body["groups"] == {
        "g": {"state": "running", "error": None, "ready": 2, "desired": 2},
    }
    assert daemon.stop() == 0


def test_every_group_fatal_exits_78(tmp_path: Path, sqlite_path: str, daemon_factory: Any) -> None:
    config = config_for(tmp_path, sqlite_path, {"only": {"queues": ["q"], "handlers": [FLAKY]}})
    daemon = daemon_factory(config).start()
    break_group(tmp_path, daemon, "only")
    assert daemon.proc is not None
    assert daemon.proc.wait(timeout=60) == 78
    assert "group only is FATAL" in daemon.output()
