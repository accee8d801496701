"""The running parent's side of a binary upgrade (`cairnqd upgrade`, SIGURG).

It starts the installed code as a new parent, its successor, passing what must
outlive it: the state file's lock, the listening sockets and one end of the link
(`upgrade_link`). The successor starts its children group by group beside ours and
says `ready` once all of them are; then we let go of the listeners, say `yours` and
retire. Until then nothing of ours changes, so a successor that fails (bad code, a
group that cannot boot, a timeout, a crash) leaves this parent running as before.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cairnqd.daemon.handler_probe import child_argv_prefix
from cairnqd.daemon.parent.exits import describe_exit
from cairnqd.daemon.parent.upgrade_link import (
    ENV_VAR,
    Inheritance,
    LinkMessage,
    decode_lines,
    send,
)
from cairnqd.daemon.systemd import SYSTEMD_ONLY_VARS
from cairnqd.daemon.wire.pipes import MessageReader, PipeError

log = logging.getLogger("cairnqd.supervisor")


@dataclass(frozen=True)
class Relaunch:
    """How to start the installed code as this daemon's successor."""

    config_path: str
    #: `--log-level` given at start, which the successor keeps.
    log_level: str | None = None

    def argv(self) -> list[str]:
        level = ["--log-level", self.log_level] if self.log_level else []
        return [*child_argv_prefix(), "-m", "cairnqd.cli", "-c", self.config_path, *level, "run"]


class Upgrade:
    """One binary upgrade, from the running parent's side. `state` moves from
    `starting` (the successor boots its groups) to `handing_over` (it said ready)
    or `failed`; the supervisor reads `link_fd` in its selector and calls
    `read()`, and `exited()` when the successor's process ends."""

    def __init__(self, proc: subprocess.Popen[bytes], link_fd: int, started: float) -> None:
        self.proc = proc
        self.link_fd = link_fd
        self.reader = MessageReader(link_fd)
        self.started = started
        self.state = "starting"
        #: From the successor's `hello`: what it runs.
        self.version = "unknown"
        self.pipe_protocol: int | None = None
        self.generation: int | None = None
        self.errors: list[str] = []
        #: Groups the successor reported ready, of how many.
        self.progress: dict[str, tuple[int, int]] = {}

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def active(self) -> bool:
        """The successor's process has not been reaped."""
        return self.proc.returncode is None

    def read(self) -> list[LinkMessage]:
        """The successor's messages now readable; a closed link reads as nothing."""
        try:
            lines = self.reader.read_lines()
        except PipeError as exc:
            lines = []
            self.fail([f"the new parent (pid {self.pid}) broke the upgrade link: {exc}"])
        messages = decode_lines(lines, "the new parent")
        for message in messages:
            self._note(message)
        return messages

    def _note(self, message: LinkMessage) -> None:
        fields = message.fields
        if message.kind == "hello":
            self.version = str(fields.get("version", "unknown"))
            protocol, generation = fields.get("pipe_protocol"), fields.get("generation")
            self.pipe_protocol = protocol if isinstance(protocol, int) else None
            self.generation = generation if isinstance(generation, int) else None
        elif message.kind == "progress":
            group = str(fields.get("group"))
            self.progress[group] = (int(fields.get("ready", 0)), int(fields.get("of", 0)))
        elif message.kind == "abort":
            errors = fields.get("errors")
            found = [str(e) for e in errors] if isinstance(errors, list) else []
            self.fail(found or [f"the new parent (pid {self.pid}) gave up without a reason"])
        elif message.kind == "ready" and self.state == "starting":
            self.state = "handing_over"

    def fail(self, errors: Sequence[str]) -> None:
        """The upgrade is over without a handover. The supervisor then closes our end
        of the link, which tells a successor still running to drain and exit."""
        if self.state in ("failed", "handed_over"):
            return
        self.state = "failed"
        self.errors = list(errors)

    def exited(self, code: int) -> None:
        self.proc.returncode = code
        if self.state == "starting":
            self.fail(
                [f"the new parent (pid {self.pid}) ended ({describe_exit(code)}) before "
                 "its children were ready; its log lines say why"]
            )  # fmt: skip

    def hand_over(self) -> bool:
        """Tell the successor it serves now; False if it is gone."""
        sent = send(self.link_fd, LinkMessage("yours"))
        if sent:
            self.state = "handed_over"
        return sent

    def close_link(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.link_fd)
        self.link_fd = -1

    def describe(self) -> dict[str, Any]:
        """What `cairnqd status` shows of the upgrade in progress."""
        return {
            "pid": self.pid,
            "version": self.version,
            "state": self.state,
            "groups": {name: {"ready": r, "of": n} for name, (r, n) in self.progress.items()},
            "for_s": round(time.monotonic() - self.started, 1),
        }


def start_successor(
    relaunch: Relaunch,
    *,
    lock_fd: int,
    state_path: str,
    listeners: Mapping[str, socket.socket],
    state: Mapping[str, Any],
    version: str,
) -> Upgrade:
    """Start the installed code as this parent's successor; OSError if it cannot be."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        fds = {name: sock.fileno() for name, sock in listeners.items()}
        inheritance = Inheritance(
            from_pid=os.getpid(),
            from_version=version,
            link_fd=theirs.fileno(),
            lock_fd=lock_fd,
            state_path=state_path,
            listeners=fds,
            state=state,
            systemd={k: v for k, v in os.environ.items() if k in SYSTEMD_ONLY_VARS},
        )
        env = {k: v for k, v in os.environ.items() if k not in SYSTEMD_ONLY_VARS}
        env[ENV_VAR] = inheritance.encode()
        proc = subprocess.Popen(
            relaunch.argv(),
            pass_fds=(theirs.fileno(), lock_fd, *fds.values()),
            close_fds=True,
            env=env,
            stdin=subprocess.DEVNULL,
            # Where this parent runs, as it was started: the config path is absolute.
            cwd=os.getcwd(),
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    link_fd = ours.detach()
    log.info(
        "upgrade: started the installed cairnqd as pid %d (%s); it starts its groups one by "
        "one beside ours and takes over once all are ready",
        proc.pid, " ".join(relaunch.argv()[1:]),
    )  # fmt: skip
    return Upgrade(proc, link_fd, time.monotonic())
