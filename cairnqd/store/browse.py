"""Values for the dashboard's reads: a keyset page of the task list, the
finished-per-minute series, the groups of failed tasks, daemon reports. Pages use
keysets, never offsets (docs/architecture.md, "Keyset pages").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cairnqd.models import STATUSES
from cairnqd.store.arguments import INT8_MAX, Params, require_int, require_str

#: The sorts of the task list, by the column each orders by (newest first).
SORTS: Mapping[str, str] = {
    "created": "created_at_ms",
    "run_at": "run_at_ms",
    "finished": "completed_at_ms",
}
#: Below every real value of a sort column: the widest range starts here.
_MIN_MS = -INT8_MAX - 1


@dataclass(frozen=True)
class TaskQuery:
    """Which page of the task list: filters (None for any), the sort, the cursor of the
    last row already shown (None for the first page) and the page size."""

    sort: str = "created"
    status: str | None = None
    queue: str | None = None
    name: str | None = None
    key: str | None = None
    from_ms: int | None = None
    to_ms: int | None = None
    cursor: tuple[int, str] | None = None
    limit: int = 50

    def params(self, task_id: str | None = None) -> Params:
        if self.sort not in SORTS:
            raise ValueError(f"sort must be one of {', '.join(SORTS)}, got {self.sort!r}")
        if self.status is not None and self.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {self.status!r}")
        require_str(self.queue, "queue", optional=True)
        require_str(self.name, "name", optional=True)
        require_int(self.limit, "limit", minimum=1, maximum=1000)
        # The first page starts above every row: the top value, and an id above any.
        cursor_ms, cursor_id = self.cursor if self.cursor is not None else (INT8_MAX, "\U0010ffff")
        upper_ms = cursor_ms if self.to_ms is None else min(cursor_ms, self.to_ms - 1)
        return {
            "status": self.status,
            "queue": self.queue,
            "name": self.name,
            "task_id": task_id,
            "from_ms": _MIN_MS if self.from_ms is None else self.from_ms,
            "upper_ms": upper_ms,
            "cursor_ms": cursor_ms,
            "cursor_id": cursor_id,
            "limit": self.limit,
        }

    @staticmethod
    def supplied(params: Params) -> frozenset[str]:
        return frozenset(k for k in ("status", "queue", "name", "task_id") if params[k] is not None)


@dataclass(frozen=True)
class TaskSummary:
    """One row of the task list: no payload, result or error."""

    id: str
    name: str
    queue: str
    status: str
    attempt: int
    max_attempts: int
    priority: int
    progress: float | None
    worker_id: str | None
    created_at_ms: int
    run_at_ms: int
    completed_at_ms: int | None
    cancel_requested: bool

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TaskSummary:
        """The values as the driver hands them over, unconverted, as `Task.from_row`
        keeps them: both drivers give ints and floats for these columns, and a value
        another client stored that is neither (text in a SQLite integer column) stays
        what it is for the reader to show, where `int()` failed the whole list."""
        return cls(
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

    def sort_value(self, sort: str) -> int | None:
        value: int | None = getattr(self, SORTS[sort])
        return value


@dataclass(frozen=True)
class FailedGroup:
    """Failed tasks of one name and one error type."""

    name: str
    error_type: str
    n: int
    last_ms: int | None
    message: str | None


#: The largest daemon report stored: a daemon with hundreds of children stays well below.
REPORT_MAX_CHARS = 1_000_000


@dataclass(frozen=True)
class DaemonReport:
    """What one daemon last reported about its groups and children."""

    daemon: str
    host: str
    snapshot: str  # JSON text, as the daemon wrote it
    reported_at_ms: int
    age_ms: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> DaemonReport:
        return cls(
            daemon=row["daemon"],
            host=row["host"],
            snapshot=row["snapshot"],
            reported_at_ms=int(row["reported_at_ms"]),
            age_ms=max(0, int(row["age_ms"])),
        )


@dataclass(frozen=True)
class SearchHit:
    """One task the search box found, with the key it was submitted with (or None)."""

    task: TaskSummary
    key: str | None


@dataclass(frozen=True)
class SearchResult:
    """What the search box found among the newest `scanned` tasks; `cut` when the
    table holds older ones it did not look through."""

    hits: list[SearchHit]
    scanned: int
    cut: bool
