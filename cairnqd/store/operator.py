"""Values for the operator's store operations: queue pauses and bulk actions.

Design note. Both live in cairnqd's own namespace. A pause is a row in
`cairnqd_queue_pauses` (migration cairnqd_0002), which only cairnqd workers that opt
in read (`Worker(honour_pauses=True)`, as every daemon child does); the protocol's
tables never learn of it. A bulk cancel or retry selects ids a page at a time and
changes each page in one transaction with the protocol's own cancel and retry
statements, so a bulk action follows exactly the rules a single-id one does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cairnqd.models import STATUSES
from cairnqd.store.arguments import Params, require_str

#: Ids changed per transaction by a bulk action: short enough that a worker's claim
#: never waits long behind it (SQLite has one writer), big enough to be quick.
BULK_BATCH = 500
#: The longest reason a pause may carry (the table's CHECK says the same).
REASON_MAX = 1000
QUEUE_MAX = 255


@dataclass(frozen=True)
class QueuePause:
    """One paused queue: since when, by whom, and why."""

    queue: str
    paused_at_ms: int
    paused_by: str
    reason: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> QueuePause:
        return cls(
            queue=row["queue"],
            paused_at_ms=int(row["paused_at_ms"]),
            paused_by=row["paused_by"],
            reason=row["reason"],
        )


def check_queue_name(queue: Any, what: str = "queue") -> str:
    require_str(queue, what)
    if not 1 <= len(queue) <= QUEUE_MAX:
        raise ValueError(f"{what} must be 1 to {QUEUE_MAX} characters, got {len(queue)}")
    return str(queue)


def check_reason(reason: Any) -> str | None:
    if reason is None:
        return None
    require_str(reason, "reason")
    if len(reason) > REASON_MAX:
        raise ValueError(f"reason must be at most {REASON_MAX} characters, got {len(reason)}")
    return str(reason)


@dataclass(frozen=True)
class TaskFilter:
    """Which tasks a bulk action (or a count) covers. `statuses` is required: each
    action names the statuses it can change; the rest are optional, None for any.
    The created bounds are epoch milliseconds on the caller's clock."""

    statuses: Sequence[str]
    queue: str | None = None
    name: str | None = None
    created_after_ms: int | None = None
    created_before_ms: int | None = None

    def params(self) -> Params:
        if not self.statuses:
            raise ValueError("statuses must name at least one status")
        for status in self.statuses:
            if status not in STATUSES:
                raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        require_str(self.queue, "queue", optional=True)
        require_str(self.name, "name", optional=True)
        return {
            "statuses": list(self.statuses),
            "queue": self.queue,
            "name": self.name,
            "created_after_ms": self.created_after_ms,
            "created_before_ms": self.created_before_ms,
        }

    @staticmethod
    def supplied(params: Params) -> frozenset[str]:
        return frozenset(k for k in ("queue", "name") if params[k] is not None)
