"""Fixtures for the tests of the `cairnqd` command line, here and in control/.

Each test gets its own directory holding a config; the `run` fixture
(tests/support/cli.py) runs `python -m cairnqd.cli ARGS` there. The operator's control
commands in control/ run beside a real daemon (`daemon_factory`, tests/support/daemon.py)
and, for `cairnqd top`, in a real terminal.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import Run, Terminal, database_line, write_config


@pytest.fixture
def sqlite_config(tmp_path: Path) -> Path:
    """A config on a SQLite file that does not exist yet (only `migrate` and the
    daemon create it)."""
    return write_config(tmp_path, database_line("sqlite", str(tmp_path / "tasks.db")))


@pytest.fixture
def sqlite_db(sqlite_config: Path, run: Run) -> Path:
    """`sqlite_config` with its database created by `cairnqd migrate`."""
    migrated = run("migrate")
    assert migrated.returncode == 0, migrated.stderr
    return sqlite_config


@pytest.fixture
def db_config(tmp_path: Path, dialect: str, db_target: str, run: Run) -> Path:
    """One config on SQLite and on a fresh Postgres database, created and migrated by
    `cairnqd migrate` first, as an operator would."""
    path = write_config(tmp_path, database_line(dialect, db_target))
    migrated = run("migrate")
    assert migrated.returncode == 0, migrated.stderr
    return path


@pytest.fixture
def groups() -> dict[str, Any]:
    return {"g": {"queues": ["a", "b"], "processes": 2, "concurrency": 4}}


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (.ci/run installs it)")
    term = Terminal()
    try:
        yield term
    finally:
        term.close()
