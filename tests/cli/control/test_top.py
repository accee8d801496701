"""`cairnqd top` driven in a real terminal: tmux runs it, the test types the keys and
reads the screen (send-keys, capture-pane)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.support.cli import Terminal, cli, shell_cli
from tests.support.daemon import write_config
from tests.support.harness import client_call, control_config
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def _queue_row(screen: str, queue: str) -> list[str]:
    for line in screen.splitlines():
        if line.split()[:1] == [queue]:
            return line.split()
    return []


def test_top_shows_the_daemon_and_queues_and_pauses_with_keys(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any, terminal: Terminal
) -> None:
    groups = {"g": {"queues": ["a", "b"], "processes": 2, "concurrency": 2}}
    daemon = daemon_factory(control_config(tmp_path, dialect, db_target, groups)).start()
    rc = tmp_path / "top.rc"
    terminal.start(shell_cli(daemon.config_path, "top", rc=rc))
    pids = [str(pid) for pid in daemon.children("g")]
    terminal.wait_screen(
        "top to show the daemon and its children",
        lambda s: f"pid {daemon.pid}" in s and all(p in s for p in pids),
    )

    async def submit(c: CairnQ) -> None:
        for _ in range(20):
            await c.submit("t.sleep", {"seconds": 0.05}, queue="a")

    client_call(dialect, db_target, submit)
    # The rates move: something was submitted and finished within the last seconds.
    terminal.wait_screen(
        "submit and finish rates for queue a",
        lambda s: len(row := _queue_row(s, "a")) >= 5 and float(row[4]) > 0,
    )

    terminal.keys("p")
    terminal.wait_screen("the pause prompt", lambda s: "pause queue:" in s)
    terminal.keys("b", "Enter")
    screen = terminal.wait_screen("b shown paused", lambda s: "PAUSED" in _queue_row(s, "b"))
    assert "paused b" in screen
    paused = cli(daemon.config_path, "status", "--json")
    assert '"queue": "b"' in paused.stdout  # in the database, for every host

    terminal.keys("r")
    terminal.wait_screen("the resume prompt", lambda s: "resume queue:" in s)
    terminal.keys("b", "Enter")
    terminal.wait_screen("b running again", lambda s: "resumed b" in s and "PAUSED" not in s)

    terminal.keys("q")
    wait_for("top to exit", lambda: rc.exists() and rc.read_text().strip() == "0")
    assert daemon.stop() == 0


def test_top_needs_a_terminal(tmp_path: Path, sqlite_path: str) -> None:
    path = write_config(
        tmp_path, control_config(tmp_path, "sqlite", sqlite_path, {"g": {"queues": ["a"]}})
    )
    done = cli(path, "top")
    assert done.returncode == 64
    assert "top needs a terminal" in done.stderr and "status --json" in done.stderr
