"""The framing under parent↔child messages: newline-delimited lines on a pipe.

Each child message is written with a single `os.write` of at most PIPE_BUF bytes,
which POSIX makes atomic on a pipe, so a child's threads (the loop and the heartbeat
thread) never interleave half-lines. The parent reads without blocking and splits on
newlines; what a line means is `messages`' business. A peer that sends a megabyte
without a newline is treated as broken.
"""

from __future__ import annotations

import os
import select
import threading
import time
from typing import Any

from cairnqd.daemon.wire.messages import PIPE_BUF, encode_atomic

MAX_PENDING = 1 << 20


class PipeError(Exception):
    pass


class MessageWriter:
    """Writes messages to a pipe fd; safe to share between threads."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()
        self.broken = False

    def send_whole(self, data: bytes) -> bool:
        """An encoded message of any size from the pipe's only writer (the parent's
        control messages); False once the reader has gone."""
        with self._lock:
            if self.broken:
                return False
            view = memoryview(data)
            try:
                while view:
                    written = os.write(self.fd, view)
                    view = view[written:]
            except OSError:
                self.broken = True
                return False
        return True

    def send(self, message: Any) -> bool:
        """One message in one atomic write; False once the reader has gone."""
        return self._write(encode_atomic(message))

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


class MessageReader:
    """Accumulates bytes from a non-blocking fd and yields complete lines."""

    def __init__(self, fd: int, initial: bytes = b"") -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._buffer = initial
        self.closed = False

    def read_lines(self) -> list[bytes]:
        """Drain what is available now; sets `closed` on EOF. Blank lines are skipped."""
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
        *lines, self._buffer = self._buffer.split(b"\n")
        return [line for line in lines if line.strip()]


def read_one(fd: int, timeout_s: float) -> tuple[bytes, bytes]:
    """Block (up to `timeout_s`) for one line on `fd`: the child's boot read.
    Returns the line and any bytes already read past it."""
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
    return line, rest
