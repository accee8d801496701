"""Fixtures for the operator's control commands: a real daemon, real CLI processes."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon.conftest import daemon_factory
from tests.daemon.daemon import REPO, base_config
from tests.daemon.harness import database_section
from tests.waiting import wait_for

__all__ = [
    "REPO_ENV",
    "Terminal",
    "cli",
    "control_config",
    "daemon_factory",
    "shell_cli",
    "write_config",
]


def control_config(
    tmp_path: Path, dialect: str, target: str, groups: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """A daemon config on `target` with quick heartbeats, so status views fill fast."""
    config = base_config(tmp_path, database_section(dialect, target), groups)
    config["metrics"] = {"listen": "127.0.0.1:0", "stats_ttl": "0s"}
    config.update(extra)
    return config


@pytest.fixture
def groups() -> dict[str, Any]:
    return {"g": {"queues": ["a", "b"], "processes": 2, "concurrency": 4}}


def write_config(tmp_path: Path, config: dict[str, Any]) -> Path:
    """Write `config` where a daemon would find it, without starting one."""
    (tmp_path / "run").mkdir(exist_ok=True)
    path = tmp_path / "cairnq.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


#: The environment a `cairnqd` subprocess runs with: this checkout, no inherited config.
REPO_ENV = {
    **{k: v for k, v in os.environ.items() if k != "CAIRNQD_CONFIG"},
    "PYTHONPATH": str(REPO),
}


def cli(config_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`cairnqd -c CONFIG ARGS` as a real process, to the end."""
    return subprocess.run(
        [sys.executable, "-m", "cairnqd.cli", "-c", str(config_path), *args],
        env=REPO_ENV,
        cwd=config_path.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Terminal:
    """One tmux server of the test's own (its own socket), one window."""

    def __init__(self) -> None:
        self.socket = f"cairnqd-test-{uuid.uuid4().hex[:8]}"

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30
        )

    def start(self, command: str) -> None:
        done = self.tmux("new-session", "-d", "-s", "top", "-x", "160", "-y", "45", command)
        assert done.returncode == 0, done.stderr

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top").stdout

    def keys(self, *keys: str) -> None:
        assert self.tmux("send-keys", "-t", "top", *keys).returncode == 0

    def wait_screen(self, what: str, check: Any, timeout: float = 30) -> str:
        def seen() -> str | None:
            text = self.screen()
            return text if check(text) else None

        return wait_for(what, seen, timeout)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.tmux("kill-server")


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (.ci/run installs it)")
    term = Terminal()
    try:
        yield term
    finally:
        term.close()


def shell_cli(config_path: Path, *args: str, rc: Path) -> str:
    """A shell command for a terminal: `cairnqd -c CONFIG ARGS`, its exit code to `rc`."""
    env = " ".join(
        f"{k}={shlex.quote(v)}" for k, v in REPO_ENV.items() if k in ("PYTHONPATH", "PATH")
    )
    words = [sys.executable, "-m", "cairnqd.cli", "-c", str(config_path), *args]
    return (
        f"cd {shlex.quote(str(REPO))} && env {env} {shlex.join(words)}; "
        f"echo $? > {shlex.quote(str(rc))}"
    )
