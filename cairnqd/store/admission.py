"""`close()` as a barrier, shared by the dialects.

An operation admitted before `close()` began runs to its end; one that arrives while
`close()` waits for those gets `StoreClosed`, so a producer that keeps submitting cannot
hold a close open forever. Once `close()` has returned the barrier lifts, and the next
use of the store opens it again (docs/architecture.md, "Closing a store").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar, Token
from typing import Any, TypeVar

from cairnqd.errors import StoreClosed

A = TypeVar("A")
T = TypeVar("T")

#: The admission the running task holds, so an operation made of other operations
#: (a submit that fetches) is counted once and is never refused halfway through. A
#: token outlives its operation only in tasks the operation spawned, and a token no
#: longer counted admits nothing.
_CURRENT: ContextVar[object | None] = ContextVar("cairnqd_store_admission", default=None)


class CloseBarrier:
    """Counts the operations under way and refuses new ones while a close drains them.

    `describe` names the store in the refusal ("SQLite store /var/lib/q.db").
    """

    def __init__(self, describe: str) -> None:
        self.describe = describe
        self.refusing = False
        self._admitted: set[object] = set()
        self._drained: asyncio.Event | None = None

    def admit(self, *, on_behalf: bool = False) -> Admission:
        """One operation. `on_behalf`: work queued by callers already admitted (a
        group commit's writer), which is counted but never refused."""
        return Admission(self, on_behalf=on_behalf)

    def on_behalf(self, write: Callable[[A], Awaitable[T]]) -> Callable[[A], Awaitable[T]]:
        """`write`, admitted even while closing."""

        async def admitted(arg: A) -> T:
            with Admission(self, on_behalf=True):
                return await write(arg)

        return admitted

    def refuse(self) -> None:
        """Turn away every operation from now until `lift()`."""
        self.refusing = True

    async def drain(self) -> None:
        """Wait until no admitted operation is left."""
        while self._admitted:
            self._drained = asyncio.Event()
            await self._drained.wait()

    def lift(self) -> None:
        self.refusing = False

    def check_open(self) -> None:
        if self.refusing:
            raise StoreClosed(f"{self.describe} is closing")


class Admission:
    """A context manager around one operation. A class rather than a generator: it
    brackets every statement, so its cost counts."""

    __slots__ = ("_barrier", "_on_behalf", "_reset", "_token")

    def __init__(self, barrier: CloseBarrier, *, on_behalf: bool = False) -> None:
        self._barrier = barrier
        self._on_behalf = on_behalf
        self._token: object | None = None
        self._reset: Token[object | None] | None = None

    def __enter__(self) -> None:
        barrier = self._barrier
        current = _CURRENT.get()
        if current is not None and current in barrier._admitted:
            return  # inside an operation already admitted
        if barrier.refusing and not self._on_behalf:
            raise StoreClosed(f"{barrier.describe} is closing")
        self._token = token = object()
        barrier._admitted.add(token)
        self._reset = _CURRENT.set(token)

    def __exit__(self, *exc: object) -> None:
        if self._token is None:
            return
        barrier = self._barrier
        assert self._reset is not None
        _CURRENT.reset(self._reset)
        barrier._admitted.discard(self._token)
        if not barrier._admitted and barrier._drained is not None:
            barrier._drained.set()


class SharedOpen:
    """A store's open (or close), one at a time: callers that arrive while it runs wait
    for the same attempt, and its failure reaches each of them."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    async def run(self, opening: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `opening()`, or wait for the run already under way."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(opening())
            self._task.add_done_callback(retrieve_failure)
        task = self._task
        try:
            await asyncio.shield(task)
        finally:
            if task.done() and self._task is task:
                self._task = None

    async def settle(self) -> None:
        """Let an open under way land first (its failure is its callers' to see)."""
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._task)


def retrieve_failure(task: asyncio.Task[None]) -> None:
    """Done-callback of a shared open: its failure is raised to every caller waiting
    on it; with none left (all cancelled), reading it here keeps asyncio from
    reporting it as never retrieved."""
    if not task.cancelled():
        task.exception()
