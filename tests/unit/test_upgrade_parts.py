"""The parts of a binary upgrade below the daemon: the inheritance and the link, the
shared state-file lock, adopted listening sockets, and the successor's group-by-group
start, held to its rules by a state machine test.

The whole upgrade, with real processes, is tests/daemon/test_upgrade.py.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cairnqd.daemon.listening import AlreadyBound, adopt, serve_on
from cairnqd.daemon.parent.statefile import StateFile, StateFileError, initial_state
from cairnqd.daemon.parent.succession import Succession
from cairnqd.daemon.parent.upgrade import Relaunch, Upgrade
from cairnqd.daemon.parent.upgrade_link import (
    ENV_VAR,
    LINK_VERSION,
    Inheritance,
    InheritanceError,
    LinkMessage,
    take_inheritance,
)


def inheritance(link_fd: int = 7, **changes: Any) -> Inheritance:
    values: dict[str, Any] = {
        "from_pid": 4121,
        "from_version": "0.2.0",
        "link_fd": link_fd,
        "lock_fd": 8,
        "state_path": "/run/cairnq/cairnqd-x.json",
        "listeners": {"metrics": 9},
        "state": {"generation": 3, "reload": {"seq": 2}},
        "systemd": {"NOTIFY_SOCKET": "/run/systemd/notify"},
    }
    values.update(changes)
    return Inheritance(**values)


def test_the_inheritance_survives_the_environment_unchanged() -> None:
    sent = inheritance()
    env = {ENV_VAR: sent.encode(), "OTHER": "x"}
    assert take_inheritance(env) == sent
    assert env == {"OTHER": "x"}, "children must not inherit it"
    assert take_inheritance(env) is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "is not JSON"),
        ("[1]", "is not a JSON object"),
        ('{"link_version": 99}', "upgrade link 99, this release 1: it is newer"),
        ('{"link_version": 1, "from_pid": "x"}', "from_pid is not an integer: 'x'"),
        ('{"link_version": 1, "from_pid": 1, "link_fd": 3, "lock_fd": 4}', "state_path"),
    ],
)
def test_an_inheritance_this_release_cannot_read_says_why(text: str, says: str) -> None:
    with pytest.raises(InheritanceError) as caught:
        Inheritance.decode(text)
    assert says in str(caught.value)
    assert LINK_VERSION == 1


def test_link_messages_round_trip_and_garbage_is_refused() -> None:
    message = LinkMessage("progress", {"group": "a", "ready": 1, "of": 2})
    assert LinkMessage.decode(message.encode().strip()) == message
    with pytest.raises(ValueError):
        LinkMessage.decode(b'{"no": "kind"}')


def test_the_lock_passes_to_a_successor_without_ever_lapsing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    old = StateFile(run / "cairnqd-x.json")
    old.acquire()
    old.write(initial_state(tmp_path / "cairnq.yaml"))
    assert old.lock_fd is not None
    inherited = os.dup(old.lock_fd)  # what crosses exec into the successor
    new = StateFile(old.path)
    new.adopt(inherited)
    assert not new.owned, "the state stays the running parent's until it hands over"
    with pytest.raises(StateFileError):
        new.write(initial_state(tmp_path / "cairnq.yaml"))
    old.hand_over()
    assert Path(old.path).exists(), "handing over must not remove the state"
    assert StateFile(old.path).locked_by_other(), "the lock lapsed between the two"
    new.promote()
    assert Path(old.lock_path).read_text() == f"{os.getpid()}\n"
    new.write({**initial_state(tmp_path / "cairnq.yaml"), "generation": 4})
    new.release()
    assert not Path(old.path).exists()
    assert not StateFile(old.path).locked_by_other()


def test_a_successor_that_never_took_over_leaves_the_state_alone(tmp_path: Path) -> None:
    old = StateFile(tmp_path / "run" / "cairnqd-x.json")
    old.acquire()
    old.write(initial_state(tmp_path / "cairnq.yaml"))
    assert old.lock_fd is not None
    new = StateFile(old.path)
    new.adopt(os.dup(old.lock_fd))
    new.release()
    assert Path(old.path).exists() and StateFile(old.path).locked_by_other()
    old.release()


def test_an_inherited_descriptor_that_is_not_the_lock_is_refused(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "run" / "cairnqd-x.json")
    state.acquire()
    other = os.open(tmp_path / "elsewhere", os.O_RDWR | os.O_CREAT)
    with pytest.raises(StateFileError, match=r"is not .*cairnqd-x\.lock"):
        StateFile(state.path).adopt(other)
    os.close(other)
    state.release()


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"adopted")

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


def test_a_server_serves_on_an_adopted_socket_where_the_old_one_listened() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sock = adopt(os.dup(listener.fileno()), "127.0.0.1", 0)
    assert isinstance(sock, AlreadyBound)
    listener.close()  # the running parent lets go; the port stays open
    server = HTTPServer(("127.0.0.1", 0), _Hello, bind_and_activate=False)
    serve_on(server, sock)
    assert server.server_address[1] == port
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
            assert resp.read() == b"adopted"
    finally:
        server.shutdown()
        server.server_close()


def test_a_socket_on_another_address_is_not_adopted() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    fd = os.dup(listener.fileno())
    assert adopt(fd, "127.0.0.1", port + 1) is None
    with pytest.raises(OSError):
        os.fstat(fd)  # closed: the listener binds afresh
    listener.close()


# -- the successor's start, as a state machine -------------------------------------------


@dataclass
class FakeChild:
    state: str = "starting"


@dataclass
class FakeSlot:
    child: FakeChild | None = None


@dataclass
class FakePool:
    name: str
    slots: list[FakeSlot]
    state: str = "running"
    fatal_error: str | None = None

    def all_ready(self) -> bool:
        return all(s.child is not None and s.child.state == "ready" for s in self.slots)


SIZES = {"a": 2, "b": 1, "c": 3}
TIMEOUT_S = 60.0


class SuccessionMachine(RuleBasedStateMachine):
    """The supervisor's part played by hand: children spawn only in admitted groups,
    get ready, crash, or a group goes FATAL; time passes. The succession must admit
    groups in order and only past fully ready ones, say `ready` once and only when
    every group is ready, and give up exactly when a group is FATAL or time is out."""

    def __init__(self) -> None:
        super().__init__()
        self.ours, self.theirs = socket.socketpair()
        self.theirs.setblocking(False)
        self.pools = {
            name: FakePool(name, [FakeSlot() for _ in range(n)]) for name, n in SIZES.items()
        }
        self.succession = Succession(inheritance(self.ours.fileno()), list(SIZES), TIMEOUT_S)
        self.now = self.succession.deadline - TIMEOUT_S
        self.errors: list[str] = []
        self.admissions: list[tuple[str, bool]] = []  # (group, were the earlier ones ready)
        self.ready_sent_when_all_ready: list[bool] = []
        self.ready_messages = 0

    def teardown(self) -> None:
        self.ours.close()
        self.theirs.close()

    def _spawn(self) -> None:
        for name in self.succession.admitted:
            for slot in self.pools[name].slots:
                if slot.child is None:
                    slot.child = FakeChild()

    @rule()
    def tick(self) -> None:
        if self.errors:
            return
        admitted_before = set(self.succession.admitted)
        earlier_ready = {
            name: all(self.pools[n].all_ready() for n in list(SIZES)[: list(SIZES).index(name)])
            for name in SIZES
        }
        was = self.succession.state
        self.errors = self.succession.step(cast(Any, self.pools), self.now)
        for name in set(self.succession.admitted) - admitted_before:
            self.admissions.append((name, earlier_ready[name]))
        if was == "starting" and self.succession.state == "ready":
            self.ready_sent_when_all_ready.append(all(p.all_ready() for p in self.pools.values()))
        self._spawn()

    @rule(group=st.sampled_from(list(SIZES)), index=st.integers(0, 2))
    def child_ready(self, group: str, index: int) -> None:
        slots = self.pools[group].slots
        child = slots[index % len(slots)].child
        if child is not None:
            child.state = "ready"

    @rule(group=st.sampled_from(list(SIZES)), index=st.integers(0, 2))
    def child_crashes(self, group: str, index: int) -> None:
        slots = self.pools[group].slots
        slots[index % len(slots)].child = None

    @precondition(lambda self: not self.errors)
    @rule(group=st.sampled_from(list(SIZES)))
    def group_goes_fatal(self, group: str) -> None:
        pool = self.pools[group]
        pool.state, pool.fatal_error = "fatal", "the handlers do not import"

    @rule(seconds=st.sampled_from([0.1, 5.0, 30.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def groups_are_admitted_in_order_past_ready_ones(self) -> None:
        order = list(SIZES)
        admitted = self.succession.admitted
        assert admitted == set(order[: len(admitted)])
        assert all(earlier_ready for _, earlier_ready in self.admissions)

    @invariant()
    def ready_is_said_once_and_only_when_every_group_is_ready(self) -> None:
        assert self.ready_sent_when_all_ready in ([], [True])
        lines = []
        try:
            while chunk := self.theirs.recv(65536):
                lines.append(chunk)
        except BlockingIOError:
            pass
        sent = [LinkMessage.decode(line) for line in b"".join(lines).splitlines() if line]
        self.ready_messages += sum(1 for m in sent if m.kind == "ready")
        assert self.ready_messages == (1 if self.succession.state == "ready" else 0)

    @invariant()
    def it_gives_up_only_for_a_fatal_group_or_the_deadline(self) -> None:
        if not self.errors:
            return
        reason = self.errors[0]
        if "cannot start under the new code" in reason:
            name = reason.split()[1]
            assert self.pools[name].state == "fatal"
        else:
            assert "reload.upgrade_timeout" in reason
            assert self.now >= self.succession.deadline


TestSuccession = SuccessionMachine.TestCase
TestSuccession.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class _FakeProc:
    """The successor's process as `Upgrade` sees it: a pid and a return code."""

    def __init__(self) -> None:
        self.pid = 4242
        self.returncode: int | None = None


def test_the_running_parent_follows_its_successor_from_hello_to_handover() -> None:
    ours, theirs = socket.socketpair()
    upgrade = Upgrade(cast(Any, _FakeProc()), ours.detach(), time.monotonic())
    try:
        for message in (
            LinkMessage("hello", {"version": "9.9.9", "pipe_protocol": 3, "generation": 4}),
            LinkMessage("progress", {"group": "a", "ready": 1, "of": 2}),
            LinkMessage("ready"),
        ):
            theirs.sendall(message.encode())
        theirs.sendall(b"not json\n")  # logged and skipped, not fatal
        kinds = [m.kind for m in wait_read(upgrade, 3)]
        assert kinds == ["hello", "progress", "ready"]
        assert (upgrade.version, upgrade.pipe_protocol, upgrade.generation) == ("9.9.9", 3, 4)
        assert upgrade.state == "handing_over"
        assert upgrade.describe()["groups"] == {"a": {"ready": 1, "of": 2}}
        assert upgrade.hand_over() and upgrade.state == "handed_over"
        assert LinkMessage.decode(theirs.recv(100).strip()).kind == "yours"
        upgrade.exited(0)  # the successor's exit after the handover fails nothing
        assert upgrade.state == "handed_over" and not upgrade.active
    finally:
        upgrade.close_link()
        theirs.close()


def test_a_successor_that_aborts_or_dies_fails_the_upgrade_with_its_reasons() -> None:
    ours, theirs = socket.socketpair()
    upgrade = Upgrade(cast(Any, _FakeProc()), ours.detach(), time.monotonic())
    theirs.sendall(LinkMessage("abort", {"errors": ["group a cannot start"]}).encode())
    wait_read(upgrade, 1)
    assert upgrade.state == "failed" and upgrade.errors == ["group a cannot start"]
    upgrade.fail(["a later reason"])  # the first failure's reasons stand
    assert upgrade.errors == ["group a cannot start"]
    upgrade.close_link()
    theirs.close()

    dying = Upgrade(cast(Any, _FakeProc()), os.open(os.devnull, os.O_RDONLY), time.monotonic())
    dying.exited(-9)
    assert dying.state == "failed" and not dying.active
    assert "ended (signal SIGKILL) before its children were ready" in dying.errors[0]
    dying.close_link()


def wait_read(upgrade: Upgrade, count: int) -> list[LinkMessage]:
    """The successor's messages, read as the supervisor's selector would deliver them."""
    got: list[LinkMessage] = []
    deadline = time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        select.select([upgrade.link_fd], [], [], 1.0)
        got += upgrade.read()
    return got


def test_a_relaunch_keeps_the_config_and_the_log_level() -> None:
    argv = Relaunch("/etc/cairnq/cairnq.yaml", "debug").argv()
    assert argv[-6:] == [
        "cairnqd.cli",
        "-c",
        "/etc/cairnq/cairnq.yaml",
        "--log-level",
        "debug",
        "run",
    ]
    assert "-P" in argv
