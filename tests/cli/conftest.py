"""Fixtures for the operator commands, each run as a real `cairnqd` subprocess.

Every test gets its own directory holding a config; `run` starts
`python -m cairnqd.cli ARGS` there (or in `cwd`), with CAIRNQD_CONFIG removed so only
the arguments choose the config.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

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


def database_line(dialect: str, target: str) -> str:
    # JSON strings are YAML double-quoted scalars: safe for any path or DSN.
    return f"path: {json.dumps(target)}" if dialect == "sqlite" else f"dsn: {json.dumps(target)}"


def write_config(directory: Path, database: str, extra: str = "", groups: str = GROUPS) -> Path:
    """A config in `directory` whose database section is `database` (`key: value`)."""
    path = directory / "cairnq.yaml"
    runtime = json.dumps(str(directory / "run"))
    path.write_text(f"version: 1\ndatabase:\n  {database}\n{groups}runtime_dir: {runtime}\n{extra}")
    return path


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
        return subprocess.run(
            [sys.executable, "-m", "cairnqd.cli", *args],
            cwd=cwd or tmp_path,
            env=env or cli_env(),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture
def db_config(tmp_path: Path, dialect: str, db_target: str, run: Run) -> Path:
    """One config on SQLite and on a fresh Postgres database, migrated."""
    path = write_config(tmp_path, database_line(dialect, db_target))
    migrated = run("migrate")
    assert migrated.returncode == 0, migrated.stderr
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
