"""`cairnqd dashboard -c FILE`: the dashboard without workers, as a real process."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.cli_control.conftest import REPO_ENV, cli
from tests.dashboard.conftest import Dash, Http
from tests.waiting import wait_for


class Standalone:
    def __init__(self, config_path: Path, *args: str) -> None:
        self.log = config_path.parent / f"standalone-{len(args)}.log"
        self.out = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cairnqd.cli", "-c", str(config_path), "dashboard", *args],
            env=REPO_ENV,
            cwd=config_path.parent,
            stdout=self.out,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def port(self) -> int:
        def seen() -> int | None:
            assert self.proc.poll() is None, self.output()
            for line in self.output().splitlines():
                if "dashboard on http://" in line:
                    return int(line.rsplit(":", 1)[1].split("/")[0])
            return None

        return wait_for("the standalone dashboard's port", seen, 60)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
        self.out.close()
        return self.proc.returncode


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
