"""cairnqd.daemon.systemd against a real AF_UNIX datagram socket standing in for systemd."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cairnqd.daemon import systemd


def _receive(sock: socket.socket) -> list[str]:
    return sock.recv(65536).decode("utf-8").split("\n")


@pytest.fixture
def path_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    address = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(address))
        sock.settimeout(2.0)
        monkeypatch.setenv("NOTIFY_SOCKET", str(address))
        yield sock


@pytest.fixture
def abstract_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    name = f"cairnqd-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2.0)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        yield sock


@pytest.fixture(params=["path", "abstract"])
def receiver(request: pytest.FixtureRequest) -> socket.socket:
    """Each address form systemd uses: a socket file, and @name in the abstract namespace."""
    sock: socket.socket = request.getfixturevalue(f"{request.param}_socket")
    return sock


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite may itself run under a systemd unit; never notify the real manager.
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(key, raising=False)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (systemd.ready, ["READY=1"]),
        (systemd.stopping, ["STOPPING=1"]),
        (systemd.watchdog, ["WATCHDOG=1"]),
        (lambda: systemd.status("3/4 children ready"), ["STATUS=3/4 children ready"]),
        (lambda: systemd.extend_timeout(20_000_000), ["EXTEND_TIMEOUT_USEC=20000000"]),
        (lambda: systemd.notify("READY=1", "STATUS=up"), ["READY=1", "STATUS=up"]),
        (lambda: systemd.ready("serving gen=1"), ["READY=1", "STATUS=serving gen=1"]),
        (lambda: systemd.stopping("draining"), ["STOPPING=1", "STATUS=draining"]),
    ],
    ids=[
        "ready",
        "stopping",
        "watchdog",
        "status",
        "extend",
        "notify",
        "ready+status",
        "stopping+status",
    ],
)
def test_helpers_send_exact_datagram(
    receiver: socket.socket, call: Callable[[], bool], expected: list[str]
) -> None:
    assert call() is True
    assert _receive(receiver) == expected


def test_reloading_carries_monotonic_timestamp(receiver: socket.socket) -> None:
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert systemd.reloading("reloading gen=2") is True
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    first, stamp, status = _receive(receiver)
    assert first == "RELOADING=1"
    key, _, value = stamp.partition("=")
    assert key == "MONOTONIC_USEC"
    assert before <= int(value) <= after
    assert status == "STATUS=reloading gen=2"


def test_reloading_without_status(abstract_socket: socket.socket) -> None:
    assert systemd.reloading() is True
    lines = _receive(abstract_socket)
    assert lines[0] == "RELOADING=1"
    assert lines[1].startswith("MONOTONIC_USEC=")
    assert len(lines) == 2


def test_status_cannot_inject_assignments(path_socket: socket.socket) -> None:
    systemd.status("bad config\nREADY=1\rSTOPPING=1\0")
    assert path_socket.recv(65536) == b"STATUS=bad config READY=1 STOPPING=1"


def test_status_is_bounded(path_socket: socket.socket) -> None:
    systemd.status("x" * 10_000)
    (line,) = _receive(path_socket)
    assert len(line.encode()) < 4096


def test_noop_without_notify_socket() -> None:
    assert systemd.ready() is False
    assert systemd.reloading() is False
    assert systemd.watchdog() is False
    assert systemd.notify() is False


@pytest.mark.parametrize(
    "address", ["/nonexistent/cairnqd/notify", "@cairnqd-nobody-listens-here", "relative/socket"]
)
def test_unreachable_socket_does_not_raise(monkeypatch: pytest.MonkeyPatch, address: str) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    assert systemd.ready() is False
    assert systemd.stopping("bye") is False


def test_stale_socket_file_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A socket file whose owner has gone: sendto gets ECONNREFUSED.
    address = tmp_path / "stale"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(address))
    monkeypatch.setenv("NOTIFY_SOCKET", str(address))
    assert systemd.watchdog() is False


def test_full_receiver_does_not_hang(
    path_socket: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nobody reads: once the receive queue is full, sends time out instead of blocking the loop.
    monkeypatch.setattr(systemd, "_SEND_TIMEOUT_S", 0.01)
    deadline = time.monotonic() + 10
    while systemd.status("y" * 900):
        assert time.monotonic() < deadline, "send never failed on a full queue"


def test_failures_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(systemd, "_send_failure_logged", False)
    monkeypatch.setenv("NOTIFY_SOCKET", "/nonexistent/cairnqd/notify")
    with caplog.at_level("DEBUG", logger="cairnqd.systemd"):
        for _ in range(3):
            systemd.watchdog()
    assert len([r for r in caplog.records if r.name == "cairnqd.systemd"]) == 1


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        ("30000000", None, 15.0),
        ("30000000", "self", 15.0),
        ("1000000", "self", 0.5),
        ("30000000", "other", None),
        ("30000000", "garbage", None),
        ("0", None, None),
        ("-5", None, None),
        ("thirty", None, None),
        (None, None, None),
        (None, "self", None),
    ],
)
def test_watchdog_interval(
    monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None, expected: float | None
) -> None:
    if usec is not None:
        monkeypatch.setenv("WATCHDOG_USEC", usec)
    if pid == "self":
        monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    elif pid == "other":
        monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    elif pid is not None:
        monkeypatch.setenv("WATCHDOG_PID", pid)
    assert systemd.watchdog_interval() == expected


def test_child_environment_strips_systemd_protocol_variables() -> None:
    parent = {
        "PATH": "/usr/bin",
        "CREDENTIALS_DIRECTORY": "/run/credentials/cairnqd.service",
        "NOTIFY_SOCKET": "/run/systemd/notify",
        "WATCHDOG_USEC": "30000000",
        "WATCHDOG_PID": "1234",
        "LISTEN_FDS": "1",
        "LISTEN_PID": "1234",
        "LISTEN_FDNAMES": "metrics",
        "LISTEN_ADDR": "0.0.0.0",  # an application's own variable, not systemd's
    }
    assert systemd.child_environment(parent) == {
        "PATH": "/usr/bin",
        "CREDENTIALS_DIRECTORY": "/run/credentials/cairnqd.service",
        "LISTEN_ADDR": "0.0.0.0",
    }
    assert "NOTIFY_SOCKET" in parent  # the input is not mutated


def test_child_environment_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("CAIRNQ_TEST_MARKER", "1")
    env = systemd.child_environment()
    assert "NOTIFY_SOCKET" not in env
    assert env["CAIRNQ_TEST_MARKER"] == "1"
