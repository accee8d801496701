"""Config files written for a test and loaded the way the daemon loads them.

The fixtures (`write`, `load`, `errors`) reach a directory's tests through its
conftest.py, which imports them; test modules import `BASE` and the types."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from cairnqd.config import Config, ConfigError, load_config

#: The smallest config the loader takes: SQLite beside the file, one group.
BASE = """\
version: 1
database:
  path: ./t.db
handlers: [cairnqd.demo:registry]
groups:
  default:
    queues: [default]
"""

Write = Callable[[str], Path]
Loader = Callable[..., Config]
Errors = Callable[..., list[str]]


@pytest.fixture
def write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Write:
    """Write cairnq.yaml in a fresh working directory (relative SQLite paths land there)."""
    monkeypatch.chdir(tmp_path)

    def write(text: str) -> Path:
        path = tmp_path / "cairnq.yaml"
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture
def load(write: Write) -> Loader:
    def load(text: str, env: Mapping[str, str] | None = None) -> Config:
        return load_config(write(text), env={} if env is None else env)

    return load


@pytest.fixture
def errors(write: Write) -> Errors:
    """The problems of a config that must fail, with the file shown as cairnq.yaml."""

    def errors(text: str, env: Mapping[str, str] | None = None) -> list[str]:
        path = write(text)
        with pytest.raises(ConfigError) as info:
            load_config(path, env={} if env is None else env)
        assert str(info.value) == "\n".join(str(p) for p in info.value.problems)
        return [str(p).replace(str(path), "cairnq.yaml", 1) for p in info.value.problems]

    return errors
