"""`DashboardReads`: the dashboard's reads (a keyset page of the task list, failed
groups) and its one write, discarding failed tasks."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from cairnqd.store.arguments import (
    INT8_MAX,
    INT8_MIN,
    check_after_id,
    check_text,
    require_bigint,
    require_int,
    require_str,
)
from cairnqd.store.browse import (
    FailedGroup,
    SearchHit,
    SearchResult,
    TaskQuery,
    TaskSummary,
)
from cairnqd.store.executor import Executor
from cairnqd.store.operator import BULK_BATCH


class DashboardReads:
    def __init__(self, executor: Executor) -> None:
        self._db = executor

    async def browse(self, query: TaskQuery) -> list[TaskSummary]:
        """One page of the task list, newest first by `query.sort`, after its cursor."""
        _check_bounds(query)
        params = query.params()
        if query.key is not None:
            require_str(query.key, "key")
            keyed = await self._db.fetch("get_key", {"key": query.key})
            if not keyed:
                await asyncio.sleep(0)
                return []
            params = query.params(task_id=keyed[0]["task_id"])
        op = f"extensions/dashboard_tasks_{query.sort}"
        rows = await self._db.scan(op, params, TaskQuery.supplied(params), list)
        return [TaskSummary.from_row(r) for r in rows]

    async def search(self, text: str, *, scan: int, limit: int) -> SearchResult:
        """Tasks among the newest `scan` whose key or name starts with `text` or whose
        payload holds it, newest first (at most `limit`); a task whose key is exactly
        `text` is found however old it is."""
        require_str(text, "text")
        require_int(scan, "scan", minimum=1, maximum=INT8_MAX)
        require_int(limit, "limit", minimum=1, maximum=10_000)
        params = {"text": text, "scan": scan, "limit": limit}
        rows = await self._db.scan("extensions/dashboard_search", params, frozenset(), list)
        hits = [SearchHit(TaskSummary.from_row(r), r["key"]) for r in rows]
        beyond = await self._db.fetch("extensions/dashboard_search_beyond", {"scan": scan})
        if beyond and not any(h.key == text for h in hits):
            # The window was cut: an exact key still finds its task, by the key's index.
            found = await self.browse(TaskQuery(key=text, limit=1))
            hits = [SearchHit(t, text) for t in found] + hits
        return SearchResult(hits=hits[:limit], scanned=scan, cut=bool(beyond))

    async def task_key(self, task_id: str) -> str | None:
        """The key `task_id` was submitted with, or None."""
        require_str(task_id, "task_id")
        rows = await self._db.fetch("extensions/dashboard_task_key", {"id": task_id})
        return str(rows[0]["key"]) if rows else None

    async def failed_groups(self, limit: int = 200) -> list[FailedGroup]:
        """Failed tasks grouped by name and error type, the biggest groups first."""
        require_int(limit, "limit", minimum=1, maximum=10_000)
        rows = await self._db.scan(
            "extensions/dashboard_failed_groups", {"limit": limit}, frozenset(), list
        )
        return [
            FailedGroup(
                name=r["name"],
                error_type=r["error_type"],
                n=int(r["n"]),
                # As stored: on SQLite max() of a group's times is text when one is.
                last_ms=r["last_ms"],
                message=r["message"],
            )
            for r in rows
        ]

    async def failed_group_ids(
        self, name: str, error_type: str, *, after_id: str = "", limit: int = BULK_BATCH
    ) -> list[str]:
        """One page of the ids of failed tasks named `name` that failed with
        `error_type` ("" for none), in id order after `after_id`."""
        require_str(name, "name")
        if not isinstance(error_type, str):
            raise ValueError(f"error_type must be a string, got {type(error_type).__name__}")
        check_text(error_type, "error_type")
        check_after_id(after_id)
        require_int(limit, "limit", minimum=1, maximum=INT8_MAX)
        params = {"name": name, "error_type": error_type, "after_id": after_id, "limit": limit}
        rows = await self._db.scan("extensions/dashboard_failed_ids", params, frozenset(), list)
        return [r["id"] for r in rows]

    async def discard_failed(self, task_ids: Sequence[str]) -> list[str]:
        """Delete each failed task of `task_ids` in one transaction; the ids deleted
        (a task no longer failed stays)."""
        ids = list(task_ids)
        for task_id in ids:
            require_str(task_id, "task_ids[]")
        if not ids:
            await asyncio.sleep(0)
            return []
        deleted: list[str] = []
        with self._db.operation():
            async with self._db.transaction() as session:
                for task_id in ids:
                    rows = await session.fetch("extensions/dashboard_discard", {"id": task_id})
                    deleted += [r["id"] for r in rows]
        return deleted


def _check_bounds(query: TaskQuery) -> None:
    """The time bounds and cursor `TaskQuery.params` computes with, checked first:
    unchecked, a string or NaN failed in its arithmetic or in Postgres alone."""
    require_bigint(query.from_ms, "from_ms", optional=True)
    if query.to_ms is not None:
        # `to_ms` is exclusive: the statement compares with to_ms - 1.
        require_int(query.to_ms, "to_ms", minimum=INT8_MIN + 1, maximum=INT8_MAX)
    if query.cursor is not None:
        if not isinstance(query.cursor, tuple) or len(query.cursor) != 2:
            raise ValueError(f"cursor must be a (milliseconds, id) pair, got {query.cursor!r}")
        require_bigint(query.cursor[0], "cursor milliseconds")
        check_after_id(query.cursor[1], "cursor id")


__all__ = ["DashboardReads"]
