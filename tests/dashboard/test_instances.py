"""Daemons by name on the Workers page (the config's `instance`, host:pid by default),
and a daemon that stopped cleanly shown as stopped at once, on SQLite and Postgres."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from cairnqd.config import ConfigError, load_config
from tests.dashboard.conftest import Dash, dashboard_config
from tests.support.daemon import Daemon, write_config
from tests.support.waiting import wait_for


def test_daemons_by_name_and_a_clean_stop_shown_at_once(dash: Dash, tmp_path: Path) -> None:
    folder = tmp_path / "second"
    folder.mkdir()
    config = dashboard_config(folder, dash.dialect, dash.target)
    config["dashboard"] = {"report": True}
    config["instance"] = "billing <1>"
    config["groups"] = {"other": {"queues": ["elsewhere"], "processes": 1}}
    del config["schedules"]
    second = Daemon(folder, config)
    http = dash.http()
    host = socket.gethostname()
    try:
        second.start()
        wait_for(
            "the second daemon on the Workers page by its name",
            lambda: "billing &lt;1&gt;</span>" in http.get("/workers").text,
            60,
        )
        page = http.get("/workers").text
        assert f"on {host}, pid {second.pid}, reported" in page
        # The first daemon has no instance: host:pid names it.
        assert f'<span class="instance">{host}:{dash.daemon.pid}</span>' in page
        fleet = page[page.index("<h2>Fleet</h2>") : page.index("</section>")]
        assert f'billing &lt;1&gt;</span> <small class="mono">{host}/{second.pid}</small>' in (
            fleet
        )
        assert "billing &lt;1&gt;" in http.get("/").text  # the overview's groups
    finally:
        assert second.stop() == 0
    # Its last report says it stopped: shown so on the next snapshot, not "stopping".
    wait_for(
        "the stopped daemon shown as stopped",
        lambda: f"pid {second.pid}, stopped" in http.get("/workers").text,
        30,
    )
    page = http.get("/workers").text
    section = page[page.index('billing &lt;1&gt;</span> <small class="note">') :]
    assert "stopped cleanly after" in section[: section.index("</section>")]
    assert "stopping" not in section[: section.index("</section>")]
    assert '<th scope="row">other</th>' not in http.get("/").text  # no groups left


def test_instance_names_are_checked(tmp_path: Path) -> None:
    config = dashboard_config(tmp_path, "sqlite", str(tmp_path / "t.db"))
    config["instance"] = "x" * 101
    with pytest.raises(ConfigError, match=r"cairnq\.yaml:\d+:\d+: instance: expected a name of 1"):
        load_config(str(write_config(tmp_path, config)))
    config["instance"] = "eu-1 billing"
    assert load_config(str(write_config(tmp_path, config))).instance_name() == "eu-1 billing"
    del config["instance"]
    loaded = load_config(str(write_config(tmp_path, config)))
    assert loaded.instance is None
    assert loaded.instance_name() == f"{socket.gethostname()}:{os.getpid()}"
