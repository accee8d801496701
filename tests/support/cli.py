"""The `cairnqd` command line as a real process: how every CLI test runs it.

`run_cli` runs `python -m cairnqd.cli ARGS` in a directory to the end and captures its
output; the `run` fixture (a pytest plugin: tests/conftest.py registers this module) is
`run_cli` in the test's own directory, and `cli` runs a command against one config, as
an operator next to a running daemon would. `running_daemon` keeps `cairnqd -c CONFIG`
running for a block; `Terminal` and `shell_cli` run a command in a real terminal (tmux).

The environment is the test runner's without CAIRNQD_CONFIG, so only the arguments
choose the config.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.waiting import wait_for

Run = Callable[..., subprocess.CompletedProcess[str]]
REPO = Path(__file__).resolve().parents[2]

GROUPS = """\
handlers: [cairnqd.demo:registry]
groups:
  default:
    queues: [default, mail]
metrics:
  listen: off
shutdown_timeout: 5s
"""


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CAIRNQD_CONFIG", None)
    env.update(extra)
    return env


#: The environment a `cairnqd` subprocess runs with: this checkout, no inherited config.
REPO_ENV = cli_env(PYTHONPATH=str(REPO))


def run_cli(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """`python -m cairnqd.cli ARGS` in `cwd`, to the end; stdout and stderr captured."""
    return subprocess.run(
        [sys.executable, "-m", "cairnqd.cli", *args],
        cwd=cwd,
        env=env or cli_env(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cli(config_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`cairnqd -c CONFIG ARGS` in the config's directory, to the end."""
    return run_cli(
        "-c", str(config_path), *args, cwd=config_path.parent, env=REPO_ENV, timeout=timeout
    )


@pytest.fixture
def run(tmp_path: Path) -> Run:
    """Run `cairnqd ARGS` in tmp_path (or `cwd`); returns the completed process."""

    def run(
        *args: str,
        timeout: float = 60,
        stdin: str | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, cwd=cwd or tmp_path, env=env, stdin=stdin, timeout=timeout)

    return run


def database_line(dialect: str, target: str) -> str:
    # JSON strings are YAML double-quoted scalars: safe for any path or DSN.
    return f"path: {json.dumps(target)}" if dialect == "sqlite" else f"dsn: {json.dumps(target)}"


def write_config(
    directory: Path,
    database: str,
    extra: str = "",
    groups: str = GROUPS,
    name: str = "cairnq.yaml",
) -> Path:
    """A config in `directory` whose database section is `database` (`key: value`)."""
    path = directory / name
    runtime = json.dumps(str(directory / "run"))
    path.write_text(f"version: 1\ndatabase:\n  {database}\n{groups}runtime_dir: {runtime}\n{extra}")
    return path


@contextlib.contextmanager
def running_daemon(
    config: Path, cwd: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """`cairnqd -c CONFIG` (the daemon) started in `cwd`, stopped by TERM on exit."""
    with subprocess.Popen(
        [sys.executable, "-m", "cairnqd.cli", "-c", str(config)],
        cwd=cwd,
        env=env or cli_env(),
        stderr=subprocess.PIPE,
        text=True,
    ) as daemon:
        try:
            yield daemon
        finally:
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()


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
