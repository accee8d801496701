"""Operator signals that reach the children through the parent, on the real daemon.

systemd/README.md documents SIGTTIN to the parent as "thread dumps of the parent and
every child": the parent dumps its own threads and forwards SIGTTIN to each child.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.daemon import base_config
from tests.waiting import wait_for

pytestmark = pytest.mark.slow


def process_state(pid: int) -> str:
    """The one-letter state from /proc (R running, S sleeping, T stopped, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.xfail(
    strict=True,
    reason="cairnqd/daemon/child.py installs no SIGTTIN handler, so the forwarded "
    "signal's default action stops (suspends) every child instead of dumping its threads",
)
def test_sigttin_dumps_every_child_without_stopping_it(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = base_config(tmp_path, {"path": sqlite_path}, {"g": {"queues": ["q"], "processes": 1}})
    daemon = daemon_factory(config).start()
    (child,) = wait_for("the child to start", lambda: list(daemon.children("g")))
    try:
        daemon.signal(signal.SIGTTIN)
        # The parent dumps its own stack first, then forwards the signal.
        wait_for("the parent's dump", lambda: "cairnqd/daemon/supervisor.py" in daemon.output())
        # Only a child's stack runs through the child module.
        wait_for(
            "the child's dump",
            lambda: "cairnqd/daemon/child.py" in daemon.output(),
            timeout=10,
        )
        assert process_state(child) != "T", "the child was stopped by SIGTTIN"
    finally:
        # Let a stopped child go on, so the daemon can drain it instead of killing it.
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGCONT)
    assert daemon.stop() == 0
