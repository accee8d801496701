"""Relative paths follow the config file, and no command but `migrate` creates a database."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.cli import Run, write_config


@pytest.fixture
def app(tmp_path: Path) -> Path:
    """tmp_path/app holds the config; tests run from tmp_path/shell."""
    (tmp_path / "app").mkdir()
    (tmp_path / "shell").mkdir()
    return tmp_path / "app"


def test_relative_sqlite_path_is_the_config_files_neighbour(
    tmp_path: Path, app: Path, run: Run
) -> None:
    write_config(app, "path: ./tasks.db")
    shell = tmp_path / "shell"
    migrated = run("-c", "../app/cairnq.yaml", "migrate", cwd=shell)
    assert migrated.returncode == 0, migrated.stderr
    assert (app / "tasks.db").exists() and not (shell / "tasks.db").exists()
    submitted = run("-c", "../app/cairnq.yaml", "submit", "demo.echo", cwd=shell)
    assert submitted.returncode == 0, submitted.stderr
    # The same database from the app's own directory, with a relative -c.
    stats = run("-c", "cairnq.yaml", "stats", "--json", cwd=app)
    assert stats.returncode == 0, stats.stderr
    assert '"queued": 1' in stats.stdout
    assert sorted(os.listdir(shell)) == []


@pytest.mark.parametrize(
    "command",
    [
        ["stats"],
        ["list"],
        ["inspect", "01J0000000000000000000000"],
        ["submit", "demo.echo"],
        ["cancel", "01J0000000000000000000000"],
        ["retry", "01J0000000000000000000000"],
        ["purge", "--dry-run"],
    ],
)
def test_a_missing_database_is_an_error_and_stays_missing(
    tmp_path: Path, app: Path, run: Run, command: list[str]
) -> None:
    write_config(app, "path: tasks.db")
    done = run("-c", "../app/cairnq.yaml", *command, cwd=tmp_path / "shell")
    assert done.returncode == 66, done.stderr
    database = app / "tasks.db"
    assert f"no database at {database}" in done.stderr
    assert "database.path in ../app/cairnq.yaml" in done.stderr
    assert "migrate" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert sorted(os.listdir(app)) == ["cairnq.yaml"]
    assert os.listdir(tmp_path / "shell") == []


def test_relative_dsn_file_on_postgres(tmp_path: Path, app: Path, run: Run, pg_dsn: str) -> None:
    (app / "secret").write_text(pg_dsn + "\n")
    write_config(app, "dsn_file: secret")
    shell = tmp_path / "shell"
    assert run("-c", "../app/cairnq.yaml", "migrate", cwd=shell).returncode == 0
    stats = run("-c", "../app/cairnq.yaml", "stats", cwd=shell)
    assert stats.returncode == 0, stats.stderr
    assert "(no tasks)" in stats.stdout
