"""`ScheduleTable`: the scheduler's own table (`cairnqd_schedules`).

Exactly one task per slot, across hosts and restarts: one transaction moves the row's
`last_slot_ms` up to the slot (only if still below it), submits the slot's task under a
key of the schedule and slot (`reuse`), and records it. A host that loses the race finds
the row moved and enqueues nothing; a crash before the commit leaves the slot still due.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from cairnqd.models import Task
from cairnqd.store.arguments import SubmitRequest
from cairnqd.store.base import TaskStore

if TYPE_CHECKING:
    from cairnqd.config import ScheduleConfig

__all__ = ["ScheduleRow", "ScheduleTable", "host_label", "rule_of", "run_now", "slot_key"]


def slot_key(schedule: str, slot_ms: int) -> str:
    """The submit key of one slot: the same on every host for the same slot."""
    return f"cairnqd:schedule:{schedule}:{slot_ms}"


@dataclass(frozen=True)
class ScheduleRow:
    """One schedule's row, with the status of the task it enqueued last."""

    name: str
    rule: str
    last_slot_ms: int
    last_fired_at_ms: int | None
    last_fired_slot_ms: int | None
    last_task_id: str | None
    last_status: str | None
    fired_by: str | None
    last_error: str | None
    last_error_at_ms: int | None
    misfires: int
    leader: str | None
    leader_seen_at_ms: int | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ScheduleRow:
        values = {f.name: row[f.name] for f in fields(cls)}
        for name in ("last_slot_ms", "misfires"):
            values[name] = int(values[name])
        return cls(**values)


class ScheduleTable:
    """The scheduler's writes and reads, each one statement or one transaction."""

    def __init__(self, store: TaskStore) -> None:
        self.store = store
        self._db = store.executor

    async def ensure(self, name: str, rule: str, at_ms: int) -> bool:
        """Create the row of a schedule seen for the first time (starting after
        `at_ms`); True when an existing row's rule changed and was restarted there."""
        await self._db.fetch(
            "extensions/schedule_ensure", {"name": name, "rule": rule, "at_ms": at_ms}
        )
        rows = await self._db.fetch(
            "extensions/schedule_rule", {"name": name, "rule": rule, "at_ms": at_ms}
        )
        return bool(rows)

    async def skip(self, name: str, through_ms: int, skipped: int, at_ms: int) -> bool:
        """Give up the missed slots through `through_ms`; False if that was done."""
        params = {"name": name, "slot_ms": through_ms, "skipped": skipped, "at_ms": at_ms}
        return bool(await self._db.fetch("extensions/schedule_skip", params))

    async def fire(
        self, name: str, slot_ms: int, request: SubmitRequest, *, host: str, at_ms: int
    ) -> Task | None:
        """Enqueue the slot's task and move past the slot, in one transaction; None
        when the slot had been dealt with already (by this host or another)."""
        params = request.insert_params()
        async with self._db.transaction() as session:
            claimed = await session.fetch(
                "extensions/schedule_advance",
                {"name": name, "slot_ms": slot_ms, "at_ms": at_ms},
            )
            if not claimed:
                return None
            task = await self.store.submit_keyed_in(session, params)
            await session.fetch(
                "extensions/schedule_fired",
                {
                    "name": name,
                    "slot_ms": slot_ms,
                    "task_id": task.id,
                    "host": host,
                    "at_ms": at_ms,
                },
            )
            return task

    async def record_failure(self, name: str, message: str, at_ms: int) -> None:
        params = {"name": name, "message": message[:1000], "at_ms": at_ms}
        await self._db.fetch("extensions/schedule_failed", params)

    async def record_manual(
        self, name: str, rule: str, task_id: str, *, host: str, at_ms: int
    ) -> None:
        params = {"name": name, "rule": rule, "task_id": task_id, "host": host, "at_ms": at_ms}
        await self._db.fetch("extensions/schedule_manual", params)

    async def mark_leader(self, host: str, at_ms: int) -> None:
        await self._db.fetch("extensions/schedule_leader", {"host": host, "at_ms": at_ms})

    async def rows(self) -> dict[str, ScheduleRow]:
        rows = await self._db.fetch("extensions/schedule_list", {})
        return {str(r["name"]): ScheduleRow.from_row(r) for r in rows}


async def run_now(
    store: TaskStore, schedule: ScheduleConfig, *, at_ms: int, by: str | None = None
) -> str:
    """Enqueue one run of `schedule` now, as an operator asks for it (`cairnqd schedules
    run`, the dashboard's Run now): a task of its own with no key, so it claims no slot
    and never collides with a scheduled fire; recorded as the schedule's manual fire.
    `by` names who asked, in the task's metadata. Returns the task id."""
    metadata: dict[str, Any] = {"schedule": schedule.schedule, "manual": True}
    if by is not None:
        metadata["by"] = by
    task = await store.submit(
        name=schedule.name,
        payload=schedule.payload,
        queue=schedule.queue,
        max_attempts=schedule.max_attempts,
        priority=schedule.priority,
        metadata=metadata,
    )
    await ScheduleTable(store).record_manual(
        schedule.schedule, rule_of(schedule), task.id, host=host_label(), at_ms=at_ms
    )
    return task.id


def host_label() -> str:
    """How a host names itself in the table: hostname and parent pid."""
    return f"{socket.gethostname()}/{os.getpid()}"


def rule_of(schedule: ScheduleConfig) -> str:
    """The rule stored with the row: timing and whether it is enabled, so re-enabling
    or changing the timing starts from the next slot."""
    return schedule.rule if schedule.enabled else f"{schedule.rule} (disabled)"
