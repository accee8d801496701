"""What passes between the running parent and its successor in a binary upgrade.

The running parent starts the installed code as a new parent with `CAIRNQD_UPGRADE`
in its environment: an `Inheritance` naming the descriptors it passed (the state
file's lock, the listening sockets, one end of a socket pair called the link) and
the state the new parent carries on from. Over the link the two exchange a few JSON
lines (`LinkMessage`). The two sides run different releases, so this format is a
protocol of its own: a release reads every earlier `LINK_VERSION` (docs/releasing.md).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from cairnqd.errors import CairnQError

log = logging.getLogger("cairnqd.supervisor")

#: Bumped when `Inheritance` or a link message changes incompatibly.
LINK_VERSION = 1
#: The environment variable that makes `cairnqd run` the successor of a running parent.
ENV_VAR = "CAIRNQD_UPGRADE"


class InheritanceError(CairnQError):
    """`CAIRNQD_UPGRADE` holds nothing this release can take over from."""


@dataclass(frozen=True)
class Inheritance:
    """What the running parent hands its successor, by descriptor number (passed
    across exec unchanged) and by value."""

    from_pid: int
    from_version: str
    #: The successor's end of the link.
    link_fd: int
    #: The state file's lock, already held: the successor never takes it anew.
    lock_fd: int
    #: The state file both parents share (its lock sits beside it).
    state_path: str
    #: Listening sockets by use (`metrics`, `dashboard`), adopted on promotion.
    listeners: Mapping[str, int] = field(default_factory=dict)
    #: The running parent's state (generation, reload and upgrade sequence numbers).
    state: Mapping[str, Any] = field(default_factory=dict)
    #: systemd's notify and watchdog variables, the successor's once it is promoted:
    #: before that only the main process may talk to systemd.
    systemd: Mapping[str, str] = field(default_factory=dict)
    link_version: int = LINK_VERSION

    def encode(self) -> str:
        return json.dumps(
            {
                "link_version": self.link_version,
                "from_pid": self.from_pid,
                "from_version": self.from_version,
                "link_fd": self.link_fd,
                "lock_fd": self.lock_fd,
                "state_path": self.state_path,
                "listeners": dict(self.listeners),
                "state": dict(self.state),
                "systemd": dict(self.systemd),
            },
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: str) -> Inheritance:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InheritanceError(f"{ENV_VAR} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise InheritanceError(f"{ENV_VAR} is not a JSON object")
        version = data.get("link_version")
        if not isinstance(version, int) or version > LINK_VERSION:
            raise InheritanceError(
                f"the running parent speaks upgrade link {version!r}, this release "
                f"{LINK_VERSION}: it is newer than the code installed; restart instead"
            )
        try:
            return cls(
                from_pid=_int(data, "from_pid"),
                from_version=str(data.get("from_version", "unknown")),
                link_fd=_int(data, "link_fd"),
                lock_fd=_int(data, "lock_fd"),
                state_path=_str(data, "state_path"),
                listeners={str(k): int(v) for k, v in dict(data.get("listeners", {})).items()},
                state=dict(data.get("state", {})),
                systemd={str(k): str(v) for k, v in dict(data.get("systemd", {})).items()},
                link_version=version,
            )
        except (TypeError, ValueError) as exc:
            raise InheritanceError(f"{ENV_VAR}: {exc}") from None


def _int(data: Mapping[str, Any], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} is not an integer: {value!r}")
    return value


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key} is not a string: {value!r}")
    return value


def take_inheritance(environ: MutableMapping[str, str] | None = None) -> Inheritance | None:
    """The inheritance this process was started with, removed from the environment
    (children must not see it); None for an ordinary start."""
    env = os.environ if environ is None else environ
    text = env.pop(ENV_VAR, None)
    return None if text is None else Inheritance.decode(text)


@dataclass(frozen=True)
class LinkMessage:
    """One line on the link. From the successor: `hello` (pid, version, pipe_protocol,
    generation), `progress` (group, ready, of), `ready` (every group is ready: hand
    over) and `abort` (errors). From the running parent: `yours` (it has let go of the
    listeners and retires its children: the successor serves from now on)."""

    kind: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        return json.dumps({"t": self.kind, **self.fields}, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def decode(cls, line: bytes) -> LinkMessage:
        """ValueError if the line is not a link message."""
        data = json.loads(line)
        if not isinstance(data, dict) or not isinstance(data.get("t"), str):
            raise ValueError(f"not a link message: {line[:80]!r}")
        kind = data.pop("t")
        return cls(kind, data)


def decode_lines(lines: list[bytes], sender: str) -> list[LinkMessage]:
    """The messages among `lines` from the link; a line this release cannot read is
    logged, naming `sender` (the two sides run different releases), and skipped."""
    messages = []
    for line in lines:
        try:
            messages.append(LinkMessage.decode(line))
        except ValueError as exc:
            log.warning("upgrade: %s sent a line we do not read: %s", sender, exc)
    return messages


def send(fd: int, message: LinkMessage) -> bool:
    """Write one message on the link (a few hundred bytes at most, so the socket's
    buffer takes it whole); False once the other side has gone."""
    try:
        os.write(fd, message.encode())
    except OSError:
        return False
    return True
