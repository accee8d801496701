"""Fixtures for the operator's control commands: a real daemon, real CLI processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon.conftest import daemon_factory
from tests.daemon.daemon import REPO, base_config
from tests.daemon.harness import database_section

__all__ = ["REPO_ENV", "cli", "control_config", "daemon_factory", "write_config"]


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
