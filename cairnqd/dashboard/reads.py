"""The dashboard's reads of rows other clients may have written: the task list, the
search box, the failed groups, a dependency graph and a task's attempt history.

They run the store's own statements (by the same names, through `store.executor`) and
keep each value as it was stored instead of converting it with `int()`: on SQLite a
column declared integer can hold text (`run_at_ms = 'soon'`), and the store's readers
(`TaskSummary.from_row`, `TaskGraph.from_rows`, `AttemptRecord.from_row`, the failed
groups) raise on such a value, which failed the whole list or page for everyone, as a
400 that blamed the request. A good row gives the same values they give (sqlite3 and
psycopg hand over ints and floats already); the pages show any other value as its text,
marked (values.py). Task reads (`store.get`, the dependency lists) already keep such
values (`Task.from_row`) and are not repeated here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from cairnqd.attempts import AttemptRecord
from cairnqd.store.arguments import INT8_MAX, require_int, require_str
from cairnqd.store.base import TaskStore
from cairnqd.store.browse import FailedGroup, SearchHit, SearchResult, TaskQuery, TaskSummary
from cairnqd.store.dependencies import GraphNode, TaskGraph

Row = Mapping[str, Any]


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def summary(row: Row) -> TaskSummary:
    """A row of the task list, its values as stored (`TaskSummary.from_row` without
    the conversions that raise on another client's text)."""
    return TaskSummary(
        id=row["id"],
        name=row["name"],
        queue=row["queue"],
        status=row["status"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        priority=row["priority"],
        progress=row["progress"],
        worker_id=row["worker_id"],
        created_at_ms=row["created_at_ms"],
        run_at_ms=row["run_at_ms"],
        completed_at_ms=row["completed_at_ms"],
        cancel_requested=row["cancel_requested_at_ms"] is not None,
    )


def _summaries(rows: list[Row]) -> list[TaskSummary]:
    return [summary(r) for r in rows]


def _hits(rows: list[Row]) -> list[SearchHit]:
    return [SearchHit(summary(r), r["key"]) for r in rows]


async def browse(store: TaskStore, query: TaskQuery) -> list[TaskSummary]:
    """One page of the task list (`DashboardReads.browse`'s statements)."""
    params = query.params()
    db = store.executor
    if query.key is not None:
        require_str(query.key, "key")
        keyed = await db.fetch("get_key", {"key": query.key})
        if not keyed:
            return []
        params = query.params(task_id=keyed[0]["task_id"])
    op = f"extensions/dashboard_tasks_{query.sort}"
    return await db.scan(op, params, TaskQuery.supplied(params), _summaries)


async def search(store: TaskStore, text: str, *, scan: int, limit: int) -> SearchResult:
    """The search box's tasks among the newest `scan` (`DashboardReads.search`'s
    statements): a task whose key is exactly `text` is found however old it is."""
    require_str(text, "text")
    require_int(scan, "scan", minimum=1, maximum=INT8_MAX)
    require_int(limit, "limit", minimum=1, maximum=10_000)
    db = store.executor
    params = {"text": text, "scan": scan, "limit": limit}
    hits = await db.scan("extensions/dashboard_search", params, frozenset(), _hits)
    beyond = await db.fetch("extensions/dashboard_search_beyond", {"scan": scan})
    if beyond and not any(h.key == text for h in hits):
        # The window was cut: an exact key still finds its task, by the key's index.
        found = await browse(store, TaskQuery(key=text, limit=1))
        hits = [SearchHit(t, text) for t in found] + hits
    return SearchResult(hits=hits[:limit], scanned=scan, cut=bool(beyond))


def _groups(rows: list[Row]) -> list[FailedGroup]:
    # On SQLite max() of a group's finish times is text when one of them is, and the
    # message is whatever type the envelope's field has: both are shown as they are.
    return [
        FailedGroup(
            name=r["name"],
            error_type=r["error_type"],
            n=int(r["n"]),
            last_ms=r["last_ms"],
            message=r["message"],
        )
        for r in rows
    ]


async def failed_groups(store: TaskStore, limit: int = 200) -> list[FailedGroup]:
    """Failed tasks by name and error type, the biggest groups first (the Failed page
    and the overview's snapshot, which one odd row must not fail)."""
    require_int(limit, "limit", minimum=1, maximum=10_000)
    return await store.executor.scan(
        "extensions/dashboard_failed_groups", {"limit": limit}, frozenset(), _groups
    )


async def graph(store: TaskStore, task_id: str, *, limit: int) -> TaskGraph:
    """The dependency graph `task_id` belongs to, at most `limit` tasks (`store.graph`'s
    statements), each node's values as stored."""
    require_str(task_id, "task_id")
    require_int(limit, "limit", minimum=1)
    db = store.executor
    nodes = await db.fetch("dependency_graph", {"task_id": task_id, "limit": limit + 1})
    kept = nodes[:limit]
    ids = [row["id"] for row in kept]
    edges = await db.fetch("dependency_graph_edges", {"ids": ids}) if ids else []
    after: dict[str, list[str]] = {}
    for edge in edges:  # ordered by task, then position
        after.setdefault(edge["task_id"], []).append(edge["parent_id"])
    return TaskGraph(
        [
            GraphNode(
                id=row["id"],
                name=row["name"],
                queue=row["queue"],
                status=row["status"],
                attempt=row["attempt"],
                max_attempts=row["max_attempts"],
                run_at_ms=row["run_at_ms"],
                updated_at_ms=row["updated_at_ms"],
                after=tuple(after.get(row["id"], ())),
            )
            for row in kept
        ],
        truncated=len(nodes) > limit,
    )


async def oldest_queued_age_ms(store: TaskStore) -> dict[str, float]:
    """Per queue, how long its oldest due queued task has waited (the `oldest_queued`
    statement of `TaskStore.oldest_queued_age_ms`). A due time another client wrote as
    -Infinity (a real SQLite keeps in the integer column) makes an infinite age, kept
    as such for the page to mark instead of an OverflowError failing the overview."""

    def ages(rows: list[Row]) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        for row in rows:
            age = row["age_ms"]
            finite = isinstance(age, int | float) and math.isfinite(age)
            out.append((row["queue"], max(0, int(age)) if finite else math.inf))
        return out

    return dict(await store.executor.scan("oldest_queued", {}, frozenset(), ages))


def _attempt_error(value: Any) -> dict[str, Any] | None:
    """An attempt's envelope: SQLite keeps it as text; text that is not JSON (or nests
    too deep to read) is shown as its message; anything but an object is left out."""
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            value = {"message": value if isinstance(value, str) else repr(value)}
    return value if isinstance(value, dict) else None


def attempt(row: Row) -> AttemptRecord:
    """One attempt record. Its attempt number and times are copied from the task's row
    by the history's triggers, so another client's text reaches them too: kept as is."""
    return AttemptRecord(
        task_id=str(row["task_id"]),
        attempt=row["attempt"],
        worker_id=_optional_str(row["worker_id"]),
        started_at_ms=row["started_at_ms"],
        finished_at_ms=row["finished_at_ms"],
        outcome=_optional_str(row["outcome"]),
        detail=_optional_str(row["detail"]),
        error=_attempt_error(row["error"]),
    )


async def attempts_of(store: TaskStore, task_id: str) -> list[AttemptRecord]:
    """Every recorded attempt of `task_id`, in the order they ran."""
    require_str(task_id, "task_id")
    rows = await store.executor.fetch("extensions/attempts_of", {"task_id": task_id})
    return [attempt(r) for r in rows]


def next_cursor(value: object, task_id: str) -> tuple[int, str] | None:
    """Where the next page of the list goes on from, after a row whose sort column
    holds `value`: (value, id). SQLite keeps a real (1.5) in a column declared integer,
    which the list's bounds compare as a number; a cursor holds integers, so after such
    a row the next page starts at every row of the integer below it (the id "", which
    the cursor reads as above every id). It may pass over another real between the two,
    never an integer's row, and never shows a row twice or goes round in a loop. Text
    or a blob compares above every number there and is never listed; None for such a
    value all the same."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value, task_id
    if isinstance(value, float) and abs(value) < float(INT8_MAX):  # NaN is not
        if value.is_integer():
            return int(value), task_id
        return int(value // 1), ""
    return None


__all__ = [
    "attempt",
    "attempts_of",
    "browse",
    "failed_groups",
    "graph",
    "next_cursor",
    "oldest_queued_age_ms",
    "search",
    "summary",
]
