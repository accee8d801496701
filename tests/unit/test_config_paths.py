"""Relative paths in a config are taken from the config file's directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cairnqd.config import load_config

CONFIG = """\
version: 1
database:
  {database}
handlers: [cairnqd.demo:registry]
groups:
  default:
    queues: [default]
logging:
  file: logs/cairnqd.log
runtime_dir: run
"""


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An app directory holding the config, and a working directory beside it."""
    (tmp_path / "app").mkdir()
    (tmp_path / "shell").mkdir()
    (tmp_path / "app" / "logs").mkdir()  # logging.file's directory must exist
    monkeypatch.chdir(tmp_path / "shell")
    return tmp_path / "app"


def test_relative_paths_follow_the_config_file(elsewhere: Path) -> None:
    path = elsewhere / "cairnq.yaml"
    path.write_text(CONFIG.format(database="path: ./data/../tasks.db"))
    config = load_config(os.path.relpath(path), env={})
    assert config.database.path == str(elsewhere / "tasks.db")
    assert config.logging.file == str(elsewhere / "logs" / "cairnqd.log")
    assert config.runtime_dir == str(elsewhere / "run")


def test_dsn_file_is_read_beside_the_config(elsewhere: Path) -> None:
    (elsewhere / "dsn").write_text("postgresql://u@h/db\n")
    path = elsewhere / "cairnq.yaml"
    path.write_text(CONFIG.format(database="dsn_file: dsn"))
    config = load_config(path, env={})
    assert config.database.dsn == "postgresql://u@h/db"
    assert config.database.dsn_file == str(elsewhere / "dsn")


@pytest.mark.parametrize("name", [":memory:", "file:tasks?mode=memory&cache=shared"])
def test_sqlite_special_names_are_kept(elsewhere: Path, name: str) -> None:
    path = elsewhere / "cairnq.yaml"
    path.write_text(CONFIG.format(database=f'path: "{name}"'))
    assert load_config(path, env={}).database.path == name


def test_home_is_expanded(elsewhere: Path) -> None:
    path = elsewhere / "cairnq.yaml"
    path.write_text(CONFIG.format(database="path: ~/tasks.db"))
    config = load_config(path, env={})
    assert config.database.path == os.path.expanduser("~/tasks.db")
