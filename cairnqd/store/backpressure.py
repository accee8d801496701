"""Queue-depth backpressure for producers, applied at the store so `ctx.submit`
fan-out is gated as well as the client.

`stats()` is unbounded, so the gate asks the bounded `queue_depth` (it reads at most
`max_depth` index entries) and turns each answer into a *grant* of up to 64 submits:
a producer enqueueing thousands of tasks probes once per 64, and concurrent submits
share one probe in flight. The limit is soft (N producers may overshoot by
(N-1)*64), which is the price of not probing per submit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cairnqd.errors import QueueFull
from cairnqd.store.arguments import INT8_MAX, require_duration, require_str

if TYPE_CHECKING:
    from cairnqd.store.base import TaskStore

MAX_GRANT = 64
_FIRST_BACKOFF_S = 0.25
_MAX_BACKOFF_S = 5.0


@dataclass
class QueueDepthLimit:
    max_depth: int
    grant: int = 0
    probe: asyncio.Future[int] | None = field(default=None, repr=False)


def _check_limit(value: object, queue: object) -> int:
    """A queue's depth limit (`queue` is "*" for the one that covers every queue)."""
    if queue != "*":
        # A key no queue is named (5, "") never matched: a limit that limited nothing.
        try:
            require_str(queue, "queue")
        except ValueError as exc:
            raise ValueError(f"max_queue_depth: {exc}") from None
    # The SDK's words, which tests/worker/test_sdk_parity.py compares.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_queue_depth for {queue!r} must be an int >= 1, got {value!r}")
    # At most a bigint: `queue_depth` binds it, and refused a larger one on every submit.
    if value > INT8_MAX:
        raise ValueError(f"max_queue_depth for {queue!r} must be <= {INT8_MAX}, got {value}")
    return value


class QueueDepthGate:
    def __init__(
        self,
        store: TaskStore,
        max_queue_depth: int | Mapping[str, int],
        *,
        max_queue_wait_ms: int = 600_000,
    ) -> None:
        self._store = store
        self._default: int | None = None
        self._per_queue: dict[str, int] = {}
        if isinstance(max_queue_depth, Mapping):
            for queue, limit in max_queue_depth.items():
                self._per_queue[queue] = _check_limit(limit, queue)
        else:
            self._default = _check_limit(max_queue_depth, "*")
        # As the client and the worker check it: with NaN no wait was ever long enough,
        # and a full queue held its submits forever instead of raising QueueFull.
        self.max_queue_wait_ms = require_duration(max_queue_wait_ms, "max_queue_wait_ms")
        self._limits: dict[str, QueueDepthLimit] = {}

    def _limit_for(self, queue: str) -> QueueDepthLimit | None:
        limit = self._limits.get(queue)
        if limit is None:
            depth = self._per_queue.get(queue, self._default)
            if depth is None:
                return None
            limit = self._limits[queue] = QueueDepthLimit(depth)
        return limit

    async def admit(self, queue: str) -> None:
        """Return once `queue` has room for one more submit, or raise QueueFull."""
        limit = self._limit_for(queue)
        if limit is None:
            return
        started = time.monotonic()
        backoff = _FIRST_BACKOFF_S
        while True:
            if limit.grant > 0:
                limit.grant -= 1
                return
            await self._refill(queue, limit)
            if limit.grant > 0:
                continue
            waited_ms = int((time.monotonic() - started) * 1000)
            if waited_ms >= self.max_queue_wait_ms:
                raise QueueFull(queue, limit.max_depth, waited_ms)
            remaining = (self.max_queue_wait_ms - waited_ms) / 1000
            await asyncio.sleep(min(backoff, remaining))
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def _refill(self, queue: str, limit: QueueDepthLimit) -> None:
        """Probe the queue once for every submit waiting on it; the grant is shared."""
        if limit.probe is None:

            async def probe() -> int:
                try:
                    headroom = await self._store.queue_depth(queue, limit.max_depth)
                    limit.grant = min(headroom, MAX_GRANT)
                    return headroom
                finally:
                    limit.probe = None

            limit.probe = asyncio.ensure_future(probe())
        await asyncio.shield(limit.probe)
