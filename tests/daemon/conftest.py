"""Fixtures shared by the daemon process tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.daemon import Daemon


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], Daemon]]:
    """Builds `Daemon`s for the test; stops every one of them afterwards."""
    started: list[Daemon] = []

    def make(config: dict[str, Any]) -> Daemon:
        daemon = Daemon(tmp_path, config)
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        daemon.stop()
