"""Retention: terminal tasks swept on a schedule by repeated, bounded purges.

A rule is one filtered `purge`. The sweeper sleeps one interval before its first
sweep, so a process restarting in a loop never purges on boot, and drains each rule in
`limit`-sized batches, yielding between batches so other writers get the lock. A purged
task's attempt records go with it (a trigger of cairnqd_0010_attempts.sql).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cairnqd.store.arguments import (
    INT8_MAX,
    check_terminal_status,
    require_duration,
    require_int,
    require_str,
)

if TYPE_CHECKING:
    from cairnqd.store.base import TaskStore

OnError = Callable[[BaseException, dict[str, Any]], None]


@dataclass(frozen=True)
class RetentionRule:
    older_than_ms: int
    queue: str | None = None
    status: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.older_than_ms, bool) or not isinstance(self.older_than_ms, int):
            raise ValueError(f"older_than_ms must be an integer, got {self.older_than_ms!r}")
        if self.older_than_ms < 0:  # the SDK's words (tests/worker/test_sdk_parity.py)
            raise ValueError(f"older_than_ms must be >= 0, got {self.older_than_ms}")
        # Checked here, where the rule is made: a rule the purge then refused (an empty
        # queue, an age past 100 years) failed every sweep, each pass logging it again.
        require_duration(self.older_than_ms, "older_than_ms")
        require_str(self.queue, "queue", optional=True)
        require_str(self.name, "name", optional=True)
        check_terminal_status(self.status)


class Retention:
    def __init__(
        self,
        older_than_ms: int | Mapping[str, int] | Sequence[RetentionRule],
        *,
        interval_ms: int = 3_600_000,
        limit: int = 1000,
        on_error: OnError | None = None,
    ) -> None:
        if isinstance(older_than_ms, int) and not isinstance(older_than_ms, bool):
            rules = [RetentionRule(older_than_ms)]
        elif isinstance(older_than_ms, Mapping):
            rules = [RetentionRule(ms, status=s) for s, ms in older_than_ms.items()]
        elif isinstance(older_than_ms, Sequence) and not isinstance(older_than_ms, str):
            rules = list(older_than_ms)
            for index, rule in enumerate(rules):
                if not isinstance(rule, RetentionRule):
                    raise ValueError(f"rules[{index}] must be a RetentionRule, got {rule!r}")
        else:
            raise ValueError(
                "older_than_ms must be milliseconds, {status: milliseconds} or a list of "
                f"RetentionRule, got {older_than_ms!r}"
            )
        if not rules:
            raise ValueError("retention older_than_ms must name at least one rule")
        # The SDK's words first (tests/worker/test_sdk_parity.py); then what it left
        # unchecked: a NaN interval, or a batch past the 64-bit LIMIT it binds to, which
        # failed every sweep.
        if isinstance(interval_ms, int | float) and interval_ms < 1:
            raise ValueError(f"retention interval_ms must be >= 1, got {interval_ms}")
        if isinstance(limit, int | float) and limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        require_duration(interval_ms, "interval_ms", minimum=1)
        require_int(limit, "limit", minimum=1, maximum=INT8_MAX)
        self.rules: tuple[RetentionRule, ...] = tuple(rules)
        self.interval_ms = interval_ms
        self.limit = limit
        self.on_error = on_error


class RetentionSweeper:
    def __init__(self, store: TaskStore, retention: Retention) -> None:
        self.store = store
        self.retention = retention
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def start(self) -> None:
        """Idempotent; a no-op outside a running event loop."""
        if self._task is not None and not self._task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._stop = asyncio.Event()
        self._task = loop.create_task(self._run())

    async def stop(self) -> None:
        """Stop the loop, waiting for a sweep in flight; start() works again after."""
        task, self._task = self._task, None
        self._stop.set()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._stop = asyncio.Event()

    async def _run(self) -> None:
        interval = self.retention.interval_ms / 1000
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), interval)
            if self._stop.is_set():
                return
            try:
                await self.sweep()
            except Exception as exc:
                self._report(exc)

    async def sweep(self) -> int:
        """Purge every rule until a batch comes back short; returns rows deleted."""
        deleted = 0
        for rule in self.retention.rules:
            while not self._stop.is_set():
                ids = await self.store.purge(
                    older_than_ms=rule.older_than_ms,
                    queue=rule.queue,
                    status=rule.status,
                    name=rule.name,
                    limit=self.retention.limit,
                )
                deleted += len(ids)
                if len(ids) < self.retention.limit:
                    break
                await asyncio.sleep(0)
        if deleted:
            # As after the daemon's sweeps: SQLite checkpoints its WAL, Postgres starts a
            # VACUUM in the background when autovacuum is off.
            await self.store.after_purge()
        return deleted

    def _report(self, exc: BaseException) -> None:
        hook = self.retention.on_error
        if hook is None:
            return
        with contextlib.suppress(Exception):
            hook(exc, {"phase": "retention"})
