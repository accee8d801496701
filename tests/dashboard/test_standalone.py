"""`cairnqd dashboard -c FILE`: the dashboard without workers, as a real process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.dashboard.conftest import Dash, Http
from tests.dashboard.standalone import Standalone
from tests.support.cli import cli


@pytest.fixture
def standalone() -> Iterator[list[Standalone]]:
    started: list[Standalone] = []
    yield started
    for process in started:
        process.stop()


def test_standalone_serves_the_same_database(
    sqlite_dash: Dash, standalone: list[Standalone]
) -> None:
    config_path = sqlite_dash.daemon.config_path
    process = Standalone(config_path, "--listen", "127.0.0.1:0")
    standalone.append(process)
    http = Http(process.port())
    http.login()
    tasks = http.get("/tasks").text
    for task_id in sqlite_dash.tasks.values():
        assert f"/task/{task_id}" in tasks
    # The daemon running this config on this host shows on the Workers page, live.
    workers = http.get("/workers").text
    assert f"pid {sqlite_dash.daemon.pid}, this host, live" in workers
    assert process.stop() == 0
    assert "dashboard stopping" in process.output()


def test_standalone_without_a_daemon(tmp_path: Path, standalone: list[Standalone]) -> None:
    config = {
        "version": 1,
        "database": {"path": str(tmp_path / "t.db")},
        "handlers": ["cairnqd.demo:registry"],
        "runtime_dir": str(tmp_path / "run"),
        "groups": {"g": {"queues": ["a"]}},
        "dashboard": {"listen": "127.0.0.1:0"},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    process = Standalone(path)
    standalone.append(process)
    http = Http(process.port())
    workers = http.get("/workers")
    assert workers.status == 200
    assert "No worker status: no daemon runs this config on this host" in workers.text
    assert http.get("/").status == 200


def test_standalone_refusals(tmp_path: Path) -> None:
    config = {
        "version": 1,
        "database": {"path": str(tmp_path / "t.db")},
        "handlers": ["cairnqd.demo:registry"],
        "groups": {"g": {"queues": ["a"]}},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    off = cli(path, "dashboard")
    assert off.returncode == 78
    assert "dashboard.listen is off" in off.stderr + off.stdout
    exposed = cli(path, "dashboard", "--listen", "0.0.0.0:0")
    assert exposed.returncode == 64
    assert "beyond this host the dashboard needs dashboard.token_file" in exposed.stderr
    garbled = cli(path, "dashboard", "--listen", "nowhere")
    assert garbled.returncode == 64 and "dashboard --listen:" in garbled.stderr
