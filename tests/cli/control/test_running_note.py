"""Held (prefetched) tasks count as running in `stats` and `cairnq_tasks`; both say
so, and the daemon tells executing from held."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.support.harness import client_call, control_config, gauge, scrape
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def test_stats_and_the_metric_say_running_includes_held(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    groups = {"g": {"queues": ["a"], "processes": 1, "concurrency": 1, "prefetch": 3}}
    daemon = daemon_factory(control_config(tmp_path, dialect, db_target, groups)).start()
    release = tmp_path / "release"

    async def submit(c: CairnQ) -> None:
        for _ in range(6):
            await c.submit("t.block", {"until": str(release)}, queue="a")

    client_call(dialect, db_target, submit)
    port = daemon.metrics_port()

    def split() -> tuple[float, float, float] | None:
        text = scrape(port)
        executing = gauge(text, "cairnq_child_tasks", group="g", state="executing")
        held = gauge(text, "cairnq_child_tasks", group="g", state="held")
        running = gauge(text, "cairnq_tasks", queue="a", status="running")
        if executing == 1 and held and running == executing + held:
            return executing, held, running
        return None

    _, held, running = wait_for("running = executing + held", split, 60)
    assert held >= 1 and running > 1  # more "running" than the one slot runs
    text = scrape(port)
    help_line = next(line for line in text.splitlines() if line.startswith("# HELP cairnq_tasks "))
    assert "held (prefetched, not started)" in help_line
    assert "cairnq_child_tasks{state}" in help_line

    stats = daemon.cli("stats")
    assert stats.returncode == 0, stats.stderr
    assert "RUNNING counts every claimed task, including those a worker holds" in stats.stdout
    status = daemon.cli("status")
    assert "EXECUTING" in status.stdout and "HELD" in status.stdout
    release.touch()
    assert daemon.stop() == 0


def test_stats_marks_paused_queues(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    daemon = daemon_factory(control_config(tmp_path, dialect, db_target, {"g": {"queues": ["a"]}}))
    daemon.start()
    assert daemon.cli("pause", "--queue", "idle").returncode == 0
    lines = daemon.cli("stats").stdout.splitlines()
    (idle,) = [line for line in lines if line.startswith("idle")]
    assert idle.split() == ["idle", "0", "0", "0", "0", "0", "0", "paused"]
    assert daemon.stop() == 0
