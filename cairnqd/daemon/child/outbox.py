"""A child's side of its events pipe: messages queue here and never block the child.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import errno
import os
import threading
from collections import deque
from dataclasses import dataclass


@dataclass
class _Queued:
    data: bytes
    latest: str | None


class Outbox:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._lock = threading.Lock()
        self._queue: deque[_Queued] = deque()
        self._head_sent = 0  # bytes of the head message the pipe has taken
        #: Set once the parent closed its end: nothing will be read again.
        self.broken = False

    def send(self, line: bytes, *, latest: str | None = None) -> bool:
        """Queue one encoded message and write what the pipe takes now. With `latest`,
        a queued message with the same key is replaced. False once the pipe is broken."""
        with self._lock:
            if self.broken:
                return False
            if latest is not None:
                self._drop_queued(latest)
            self._queue.append(_Queued(line, latest))
            self._flush_locked()
            return not self.broken

    def flush(self) -> bool:
        """Write what the pipe takes; True when nothing is left queued."""
        with self._lock:
            self._flush_locked()
            return not self._queue

    @property
    def pending(self) -> int:
        """Messages still queued (the head may be partly written)."""
        return len(self._queue)

    def _drop_queued(self, latest: str) -> None:
        # Never the head once part of it is written: its remainder must follow.
        keep_head = self._head_sent > 0
        kept: deque[_Queued] = deque()
        for index, item in enumerate(self._queue):
            if item.latest == latest and not (keep_head and index == 0):
                continue
            kept.append(item)
        self._queue = kept

    def _flush_locked(self) -> None:
        while self._queue and not self.broken:
            head = self._queue[0]
            try:
                written = os.write(self.fd, head.data[self._head_sent :])
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                self.broken = True
                self._queue.clear()
                return
            self._head_sent += written
            if self._head_sent >= len(head.data):
                self._queue.popleft()
                self._head_sent = 0
