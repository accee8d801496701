"""sd_notify(3) for the parent, in plain stdlib.

systemd hands a ``Type=notify`` service an ``AF_UNIX``/``SOCK_DGRAM`` address in ``$NOTIFY_SOCKET``
(a path, or ``@name`` for the abstract namespace); each datagram is newline-separated
``KEY=VALUE`` assignments. Outside systemd the variable is unset and every call is a no-op, so
the supervisor calls these unconditionally. Nothing here raises: a lost notification must never
take the supervisor loop down with it, and systemd's own timeouts cover a message that never
arrives.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger("cairnqd.systemd")

# A full receive queue would block a blocking send; the loop also pings the watchdog, so bound
# the stall instead of hanging on it.
_SEND_TIMEOUT_S = 1.0
# systemd drops a datagram of PIPE_BUF (4096) bytes or more; keep STATUS= well under it.
_STATUS_MAX_CHARS = 1000
# The variables of systemd's notify, watchdog and socket-activation protocols. Exact names, not
# prefixes: a handler's own LISTEN_ADDR must still reach it.
SYSTEMD_ONLY_VARS = frozenset(
    {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"}
)

_send_failure_logged = False


def notify(*lines: str) -> bool:
    """Send ``lines`` as one datagram; True if it was handed to the socket."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or not lines:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        # vsock: and relative addresses are not ours to guess at.
        _log_send_failure(address, "unsupported address")
        return False
    payload = "\n".join(lines).encode("utf-8", "replace")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.settimeout(_SEND_TIMEOUT_S)
            sock.sendto(payload, address)
    except OSError as exc:  # ENOENT, ECONNREFUSED, EAGAIN past the timeout, EPERM
        _log_send_failure(address, exc)
        return False
    return True


def _log_send_failure(address: str, reason: object) -> None:
    # Once per process: a missing socket fails identically on every watchdog tick.
    global _send_failure_logged
    if not _send_failure_logged:
        _send_failure_logged = True
        log.debug("sd_notify to %r failed: %s (further failures not logged)", address, reason)


def _status_line(text: str) -> str:
    # systemd splits on \n and \r, so either would let the text forge READY=1 or worse; an
    # embedded NUL makes it drop the whole datagram.
    flat = " ".join(text.replace("\0", "").splitlines())
    return "STATUS=" + flat[:_STATUS_MAX_CHARS]


def ready(status_text: str | None = None) -> bool:
    return notify("READY=1", *_optional_status(status_text))


def reloading(status_text: str | None = None) -> bool:
    # Without MONOTONIC_USEC a Type=notify-reload manager (253+) ignores the message and
    # `systemctl reload` hangs; older managers ignore the extra key.
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify("RELOADING=1", f"MONOTONIC_USEC={usec}", *_optional_status(status_text))


def stopping(status_text: str | None = None) -> bool:
    return notify("STOPPING=1", *_optional_status(status_text))


def status(text: str) -> bool:
    return notify(_status_line(text))


def main_pid(pid: int) -> bool:
    """The service's main process is `pid` from now on: a binary upgrade's successor.
    Sent by the main process itself, which NotifyAccess=main allows."""
    return notify(f"MAINPID={pid}")


def watchdog() -> bool:
    return notify("WATCHDOG=1")


def extend_timeout(usec: int) -> bool:
    """Ask for ``usec`` more from now on the running start/stop/reload timeout."""
    return notify(f"EXTEND_TIMEOUT_USEC={max(0, usec)}")


def _optional_status(text: str | None) -> tuple[str, ...]:
    return () if text is None else (_status_line(text),)


def watchdog_interval() -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of WatchdogSec), or None if not for us."""
    try:
        period_usec = int(os.environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if period_usec <= 0:
        return None
    # WATCHDOG_PID names the process systemd watches; an inherited pair belongs to someone else.
    owner = os.environ.get("WATCHDOG_PID")
    if owner is not None:
        try:
            if int(owner) != os.getpid():
                return None
        except ValueError:
            return None
    return period_usec / 2 / 1_000_000


def child_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default ``os.environ``) without systemd's per-service protocol variables.

    A child that inherited them could send READY=1 (NotifyAccess=main drops it, noisily) or
    take the parent's WATCHDOG_PID/LISTEN_FDS as its own.
    """
    source = os.environ if env is None else env
    return {key: value for key, value in source.items() if key not in SYSTEMD_ONLY_VARS}
