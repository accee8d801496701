"""The host's one LISTEN, on `database.direct_dsn`, passed on to the children.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import logging
import math
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
#: Tasks settled: the protocol's notification per task that reaches a final status.
SETTLED_CHANNEL = "cairnq_done"
#: The `wake` key that says tasks settled somewhere, which may be a flow-control
#: limit's room (the same key a child's `RelayedWakes` flags it under: listen.py's
#: ANY). No queue can be named so: Postgres text holds no NUL.
SETTLED = "\x00any"
#: At most this often the children hear that tasks settled: under a stream every task
#: settles, and a child waiting for room looks no sooner than this after its last look
#: anyway (`ROOM_GAP_MS` in cairnqd/_claimloop.py).
SETTLED_EVERY_S = 0.02


class WakeRelay:
    """See the module docstring. `start()` once; `take()` from the supervisor's loop
    when `fd` is readable; `stop()` at the end."""

    def __init__(
        self, database: DatabaseConfig, *, on_deaf: Callable[[], None], settled: bool = False
    ) -> None:
        """`settled`: also LISTEN for tasks settling and pass that on (`SETTLED`), for
        children a flow-control limit holds back (`watch_settled`)."""
        self._database = database
        self._on_deaf = on_deaf
        self._settled = settled
        #: The settlements' LISTEN while `settled` holds, in the thread.
        self._settled_listener: Any = None
        self._settled_timer: asyncio.TimerHandle | None = None
        self._settled_passed_at = -math.inf
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
        self.listener = self._listen(CHANNEL, self._heard, on_deaf=self._on_deaf)
        await self._watch_settled(self._settled)

    def _listen(
        self,
        channel: str,
        on_notify: Callable[[str], None],
        on_deaf: Callable[[], None] | None = None,
    ) -> Any:
        """A started LISTEN on `channel` (a store/postgres/listen.py `Listener`)."""
        # Imported here: psycopg stays out of a SQLite daemon's parent.
        from cairnqd.store.postgres import PostgresStore
        from cairnqd.store.postgres.listen import Listener

        store = store_for(self._database, "background")
        assert isinstance(store, PostgresStore) and store.session_conninfo is not None
        listener = Listener(
            store.session_conninfo,
            channel,
            connect_timeout_s=self._database.connect_timeout.total_seconds(),
            # Through the pooled DSN, the way a task's notification travels.
            send_notify=store.send_notify,
            on_deaf=on_deaf,
            on_notify=on_notify,
        )
        listener.start()
        return listener

    def watch_settled(self, on: bool) -> None:
        """LISTEN for tasks settling (limits are configured) or stop (none are), from
        the supervisor's thread after a reload."""
        self._settled = on
        if self._thread.running() and self.listener is not None:
            self._thread.submit(self._watch_settled(on))

    async def _watch_settled(self, on: bool) -> None:
        current = self._settled_listener
        if on and current is None:
            self._settled_listener = self._listen(SETTLED_CHANNEL, self._heard_settled)
        elif not on and current is not None:
            self._settled_listener = None
            await current.stop()

    def _heard_settled(self, _task_id: str) -> None:
        """A task settled: pass it on at once, or when `SETTLED_EVERY_S` has passed
        since the last time (one wake-up for all that settled meanwhile)."""
        if self._settled_timer is not None:
            return
        loop = asyncio.get_running_loop()
        wait = self._settled_passed_at + SETTLED_EVERY_S - loop.time()
        if wait <= 0:
            self._pass_settled()
        else:
            self._settled_timer = loop.call_later(wait, self._pass_settled)

    def _pass_settled(self) -> None:
        self._settled_timer = None
        self._settled_passed_at = asyncio.get_running_loop().time()
        self._heard(SETTLED)

    def _heard(self, queue: str) -> None:
        with self._lock:
            first = not self._pending
            self._pending[queue] = self._pending.get(queue, 0) + 1
        if first:
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._fd_w, b"w")

    def take(self) -> dict[str, int]:
        """The queues notified since the last call, with how many notifications each,
        and `SETTLED` if tasks settled meanwhile (drains the wake-up pipe)."""
        # `_heard` writes a byte only when the pending set was empty, so the pipe holds
        # a byte or two: one read drains it (reading again until EAGAIN cost a system
        # call and an exception per wake-up).
        with contextlib.suppress(BlockingIOError, OSError):
            os.read(self.fd, 4096)
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._thread.running():
            for listener in (self.listener, self._settled_listener):
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


__all__ = ["CHANNEL", "SETTLED", "WakeRelay", "backed_up"]
