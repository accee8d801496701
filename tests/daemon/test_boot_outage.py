"""A database that is down at boot: the daemon waits for it instead of failing its start.

Under systemd a `Type=notify` unit that has not said READY=1 within its start timeout is
killed; while the children wait for the database the parent keeps extending that timeout.
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, base_config

pytestmark = pytest.mark.slow


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_database_at_boot_extends_the_start_timeout(tmp_path: Path) -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{closed_port()}/postgres?connect_timeout=1"
    groups = {"g": {"queues": ["q"], "processes": 1, "concurrency": 1}}
    config = base_config(tmp_path, {"dsn": dsn, "connect_timeout": "1s"}, groups)
    config["database"]["connection_check"] = "off"
    daemon = Daemon(tmp_path, config).start(wait_ready=False)
    try:
        first = daemon.wait_notify("EXTEND_TIMEOUT_USEC=", timeout=60)
        assert daemon.messages[first] == "EXTEND_TIMEOUT_USEC=30000000"
        assert not any(m.startswith("READY=1") for m in daemon.messages)
        # It keeps asking while the outage lasts, not once.
        daemon.wait_notify("EXTEND_TIMEOUT_USEC=", timeout=30, start=first + 1)
        assert any("waiting for the database" in m for m in daemon.messages)
    finally:
        daemon.signal(signal.SIGTERM)
        assert daemon.stop() == 0


def test_a_stop_while_children_wait_for_the_database_is_quiet_and_clean(tmp_path: Path) -> None:
    """A child told to drain while it waits for the database at boot holds no task: it
    leaves without being reported as a crash, and nothing is handed back (a write the
    absent database would refuse)."""
    dsn = f"postgresql://postgres@127.0.0.1:{closed_port()}/postgres?connect_timeout=1"
    groups = {"g": {"queues": ["q"], "processes": 2, "concurrency": 1}}
    config = base_config(tmp_path, {"dsn": dsn, "connect_timeout": "1s"}, groups)
    config["database"]["connection_check"] = "off"
    daemon = Daemon(tmp_path, config).start(wait_ready=False)
    daemon.wait_notify("EXTEND_TIMEOUT_USEC=", timeout=60)  # the children wait for it
    daemon.signal(signal.SIGTERM)
    assert daemon.stop() == 0
    log = daemon.output()
    assert log.count("left before it was ready (drain)") == 2, log
    assert "died while booting" not in log
    assert "hand-back" not in log
