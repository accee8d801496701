"""The host's one LISTEN, on `database.direct_dsn`, passed on to the children.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import logging
import os
import termios
import threading
from collections.abc import Callable
from typing import Any

from cairnqd.config import DatabaseConfig
from cairnqd.daemon.parent.dbthread import LoopThread
from cairnqd.store.factory import store_for

log = logging.getLogger("cairnqd.supervisor")

CHANNEL = "cairnq_queued"


class WakeRelay:
    """See the module docstring. `start()` once; `take()` from the supervisor's loop
    when `fd` is readable; `stop()` at the end."""

    def __init__(self, database: DatabaseConfig, *, on_deaf: Callable[[], None]) -> None:
        self._database = database
        self._on_deaf = on_deaf
        self._thread = LoopThread("cairnqd-wakes")
        self._lock = threading.Lock()
        #: Queue -> notifications heard since the last `take()`.
        self._pending: dict[str, int] = {}
        self.fd, self._fd_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopped = threading.Event()
        #: The LISTEN (a store/postgres/listen.py `Listener`), once the thread started it.
        self.listener: Any = None

    def start(self) -> None:
        self._thread.start()
        self._thread.submit(self._serve())

    async def _serve(self) -> None:
        # Imported here: psycopg stays out of a SQLite daemon's parent.
        from cairnqd.store.postgres import PostgresStore
        from cairnqd.store.postgres.listen import Listener

        store = store_for(self._database, "background")
        assert isinstance(store, PostgresStore) and store.session_conninfo is not None

        listener = Listener(
            store.session_conninfo,
            CHANNEL,
            connect_timeout_s=self._database.connect_timeout.total_seconds(),
            # Through the pooled DSN, the way a task's notification travels.
            send_notify=store.send_notify,
            on_deaf=self._on_deaf,
            on_notify=self._heard,
        )
        listener.start()
        self.listener = listener

    def _heard(self, queue: str) -> None:
        with self._lock:
            first = not self._pending
            self._pending[queue] = self._pending.get(queue, 0) + 1
        if first:
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._fd_w, b"w")

    def take(self) -> dict[str, int]:
        """The queues notified since the last call, with how many notifications each
        (drains the wake-up pipe)."""
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self.fd, 4096):
                pass
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._thread.running():
            listener = self.listener
            if listener is not None:
                with contextlib.suppress(Exception):
                    self._thread.submit(listener.stop()).result(timeout=timeout_s)
            self._thread.stop(timeout_s)
        for fd in (self.fd, self._fd_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def backed_up(fd: int, limit: int = 16384) -> bool:
    """Whether more than `limit` bytes wait unread in the pipe `fd` writes to."""
    buf = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, buf, True)
    except OSError:
        return True
    return buf[0] > limit


__all__ = ["CHANNEL", "WakeRelay", "backed_up"]
