"""`BulkActions`: cancel or retry many tasks, a page of ids at a time, each page in one
transaction through the protocol's own `cancel` and `retry` statements, so a bulk
action keeps exactly the rules a single-id one does."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from cairnqd.models import Task
from cairnqd.store.arguments import (
    INT8_MAX,
    Params,
    check_after_id,
    require_bigint,
    require_int,
    require_str,
)
from cairnqd.store.executor import Executor, Row, Session
from cairnqd.store.operator import BULK_BATCH, TaskFilter

#: What a bulk action by filter can do: cancel or retry.
COMMANDS = ("cancel", "retry")


@dataclass(frozen=True)
class BulkOutcome:
    """What one bulk action by filter did."""

    #: Tasks that matched the filter when their page was read.
    matched: int
    #: Of those, the tasks it changed (the rest changed status meanwhile).
    changed: int
    #: Of the canceled ones, those running: cancel requested, their handlers settle them.
    requested: int


class BulkActions:
    def __init__(self, executor: Executor) -> None:
        self._db = executor

    async def apply(
        self, command: str, where: TaskFilter, *, reset_attempt: bool = False
    ) -> BulkOutcome:
        """`command` (cancel or retry) every task matching `where`, `BULK_BATCH` ids per
        transaction (`cairnqd cancel --queue ...`, the dashboard's "all matching")."""
        if command not in COMMANDS:
            raise ValueError(f"command must be one of {', '.join(COMMANDS)}, got {command!r}")
        matched = changed = requested = 0
        after = ""
        while True:
            ids = await self.ids(where, after_id=after, limit=BULK_BATCH)
            if not ids:
                break
            if command == "cancel":
                tasks = await self.cancel(ids)
                requested += sum(1 for t in tasks if t.status == "running")
            else:
                tasks = await self.retry(ids, reset_attempt=reset_attempt)
            matched, changed, after = matched + len(ids), changed + len(tasks), ids[-1]
            if len(ids) < BULK_BATCH:
                break
        return BulkOutcome(matched, changed, requested)

    async def count(self, where: TaskFilter) -> int:
        """How many tasks match `where`."""
        params = _filter_params(where)
        rows = await self._db.scan("extensions/task_count", params, where.supplied(params), list)
        return int(rows[0]["n"])

    async def ids(
        self, where: TaskFilter, *, after_id: str = "", limit: int = BULK_BATCH
    ) -> list[str]:
        """One page of the ids matching `where`, in id order, after `after_id`."""
        params = _filter_params(where)
        check_after_id(after_id)
        require_int(limit, "limit", minimum=1, maximum=INT8_MAX)
        params = {**params, "after_id": after_id, "limit": limit}
        rows = await self._db.scan("extensions/task_ids", params, where.supplied(params), list)
        return [r["id"] for r in rows]

    async def cancel(self, task_ids: Sequence[str]) -> list[Task]:
        """`cancel` each id, all in one transaction; the tasks it changed (one no
        longer queued or running is skipped, as `cancel` skips it)."""
        return await self._each_in_one_transaction("cancel", task_ids, {})

    async def retry(self, task_ids: Sequence[str], *, reset_attempt: bool = False) -> list[Task]:
        """`retry` each id, all in one transaction; the tasks it requeued."""
        return await self._each_in_one_transaction(
            "retry", task_ids, {"reset_attempt": bool(reset_attempt)}
        )

    async def _each_in_one_transaction(
        self, op: str, task_ids: Sequence[str], params: Params
    ) -> list[Task]:
        ids = list(task_ids)
        for task_id in ids:
            require_str(task_id, "task_ids[]")
        if not ids:
            await asyncio.sleep(0)  # every operation yields, even one with nothing to do
            return []

        async def each(session: Session) -> list[Row]:
            found: list[Row] = []
            for task_id in ids:
                found += await session.fetch(op, {**params, "id": task_id})
            return found

        with self._db.operation():
            # A row whose text the driver refuses (another client's) is read back
            # escaped on a second run, not left to fail the whole batch.
            rows = await self._db.replayable(each)
        return self._db.tasks(rows)


__all__ = ["COMMANDS", "BulkActions", "BulkOutcome"]


def _filter_params(where: TaskFilter) -> Params:
    """`where.params()`, its created bounds checked as well: unchecked, SQLite compared
    a string or NaN and matched whatever it matched, while Postgres refused them."""
    params = where.params()
    require_bigint(where.created_after_ms, "created_after_ms", optional=True)
    require_bigint(where.created_before_ms, "created_before_ms", optional=True)
    return params
