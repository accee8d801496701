"""The parent↔child pipe protocol: newline-delimited JSON, one object per write.

Each message is written with a single `os.write` of at most PIPE_BUF bytes, which
POSIX makes atomic on a pipe, so a child's threads (the loop and the heartbeat thread)
never interleave half-lines. The parent reads without blocking and splits on newlines;
a line that is not JSON is reported, not fatal, and a peer that sends a megabyte
without a newline is treated as broken.
"""

from __future__ import annotations

import json
import os
import select
import threading
import time
from typing import Any

PROTOCOL_VERSION = 1
PIPE_BUF = 4096
MAX_PENDING = 1 << 20


class PipeError(Exception):
    pass


class MessageWriter:
    """Writes JSON lines to a pipe fd; safe to share between threads."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()
        self.broken = False

    def send_whole(self, kind: str, /, **fields: Any) -> None:
        """A message of any size from a single writer (the parent's `boot`)."""
        data = (json.dumps({"t": kind, **fields}, separators=(",", ":")) + "\n").encode()
        with self._lock:
            view = memoryview(data)
            while view:
                written = os.write(self.fd, view)
                view = view[written:]

    def send_lines(self, lines: list[bytes]) -> bool:
        """Several encoded messages, packed into as few atomic writes as PIPE_BUF
        allows (the parent then wakes once per batch, not once per task event)."""
        chunk = b""
        for line in lines:
            if chunk and len(chunk) + len(line) > PIPE_BUF:
                if not self._write(chunk):
                    return False
                chunk = b""
            chunk += line
        return self._write(chunk) if chunk else True

    def _write(self, data: bytes) -> bool:
        with self._lock:
            if self.broken:
                return False
            try:
                os.write(self.fd, data)
            except OSError:
                self.broken = True
                return False
        return True

    def send(self, kind: str, /, **fields: Any) -> bool:
        data = (json.dumps({"t": kind, **fields}, separators=(",", ":")) + "\n").encode()
        if len(data) > PIPE_BUF:
            # Keep the message atomic: drop what does not fit rather than split it.
            data = (json.dumps({"t": kind, "truncated": True}) + "\n").encode()
        with self._lock:
            if self.broken:
                return False
            try:
                os.write(self.fd, data)
            except (BrokenPipeError, OSError):
                self.broken = True
                return False
        return True


class MessageReader:
    """Accumulates bytes from a non-blocking fd and yields complete messages."""

    def __init__(self, fd: int, initial: bytes = b"") -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._buffer = initial
        self.closed = False
        self.malformed = 0

    def read(self) -> list[dict[str, Any]]:
        """Drain what is available now; sets `closed` on EOF."""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                self.closed = True
                break
            if not chunk:
                self.closed = True
                break
            self._buffer += chunk
            if len(self._buffer) > MAX_PENDING and b"\n" not in self._buffer:
                raise PipeError("peer sent 1 MiB without a newline")
        messages: list[dict[str, Any]] = []
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                self.malformed += 1
                continue
            if isinstance(message, dict):
                messages.append(message)
            else:
                self.malformed += 1
        return messages


def encode(kind: str, /, **fields: Any) -> bytes:
    """One message as a line; oversized ones shrink to their type (never split)."""
    data = (json.dumps({"t": kind, **fields}, separators=(",", ":")) + "\n").encode()
    if len(data) > PIPE_BUF:
        data = (json.dumps({"t": kind, "truncated": True}) + "\n").encode()
    return data


def read_one(fd: int, timeout_s: float) -> tuple[dict[str, Any], bytes]:
    """Block (up to `timeout_s`) for one message on `fd`: the child's boot read.
    Returns the message and any bytes already read past it."""
    deadline = time.monotonic() + timeout_s
    buffer = b""
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PipeError(f"no message within {timeout_s:.0f}s")
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            raise PipeError("pipe closed before a message arrived")
        buffer += chunk
        if len(buffer) > MAX_PENDING:
            raise PipeError("message too large")
    line, _, rest = buffer.partition(b"\n")
    message = json.loads(line)
    if not isinstance(message, dict):
        raise PipeError("message is not a JSON object")
    return message, rest
