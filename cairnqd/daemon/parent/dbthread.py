"""`LoopThread`: one daemon thread running one asyncio loop, for database work.

The supervisor's loop must never wait on the database, so each of the parent's
database duties (maintenance, the metrics collector) runs its coroutines on a
`LoopThread` of its own, with a store opened inside that thread: a connection
never crosses threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("cairnqd.supervisor")

#: How long a stopping loop waits for its cancelled tasks to end.
CANCEL_WAIT_S = 1.0
#: How long a stop waits for a loop's work to end once its database calls were cut
#: short, before it cancels the work (`LoopThread.cut_short`).
SEVERED_GRACE_S = 1.0
#: Tasks a stopped loop left behind (`LoopThread._run`).
_abandoned: list[asyncio.Task[Any]] = []


class LoopThread:
    """One daemon thread running one asyncio loop: database work off the caller's loop.

    `start()` is idempotent; `stop()` stops the loop, cancels what is left on it and
    joins the thread. Coroutines are handed over with `submit()` from any thread.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        with self._lock:
            if self.running():
                return
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=self._run, args=(loop,), name=self.name, daemon=True)
            self._loop, self._thread = loop, thread
            thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        loop = self._loop
        if loop is None or not self.running():
            coro.close()
            raise RuntimeError(f"{self.name} is not running")
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run `callback` on the loop; a no-op once the loop is gone."""
        loop = self._loop
        if loop is not None and self.running():
            with contextlib.suppress(RuntimeError):  # closed between the check and the call
                loop.call_soon_threadsafe(callback)

    def stop(self, timeout_s: float) -> bool:
        """Stop the loop and join the thread; False if it did not end in time."""
        with self._lock:
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return True
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        thread.join(max(0.0, timeout_s))
        return not thread.is_alive()

    def finish_or_cut(
        self,
        serving: concurrent.futures.Future[Any],
        wait_s: float,
        sever: Callable[[], object],
        what: str,
        logger: logging.Logger,
    ) -> bool:
        """Wait up to `wait_s` for `serving` (a thread's loop coroutine on its way out);
        past that, say so on `logger` and `cut_short` its calls. True if it ended on its
        own in time (a failure is logged, and counts as ended)."""
        try:
            serving.result(timeout=wait_s)
        except TimeoutError:
            logger.warning(
                "%s still busy after %.1fs; cutting its database calls short", what, wait_s
            )
            self.cut_short(serving, sever)
            return False
        except concurrent.futures.CancelledError:
            pass
        except Exception:
            logger.exception("%s failed", what)
        return True

    def cut_short(
        self, serving: concurrent.futures.Future[Any], sever: Callable[[], object]
    ) -> None:
        """End `serving` now: `sever` its store's calls on the loop (`TaskStore.sever`:
        a call stuck on a silent database fails at once), give it `SEVERED_GRACE_S` to
        finish on its own, then cancel it. A cancel alone had psycopg ask the server to
        cancel each stuck query first, up to 10 s through a partition."""
        self.call_soon(sever)
        with contextlib.suppress(Exception):
            serving.result(timeout=SEVERED_GRACE_S)
        serving.cancel()

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                # Bounded: a task may swallow its cancellation and wait on (psycopg_pool's
                # workers do, caught mid-connect to a silent server), and the thread
                # must end all the same.
                _, stuck = loop.run_until_complete(asyncio.wait(pending, timeout=CANCEL_WAIT_S))
                if stuck:
                    log.debug(
                        "%s: %d task(s) left running after cancel: %s",
                        threading.current_thread().name,
                        len(stuck),
                        ", ".join(sorted(t.get_name() for t in stuck)),
                    )
                    # Never collected, so never reported as destroyed while pending:
                    # the process is on its way out.
                    _abandoned.extend(stuck)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
