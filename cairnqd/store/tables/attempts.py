"""`AttemptHistory`: the records of every attempt of a task (`cairnqd_attempts`), which
triggers on the task table write (cairnqd_0010_attempts.sql). The store only reads
them, and names the attempts a hand-back closed, which the triggers cannot tell apart
from a failure (docs/architecture.md, "Attempt history")."""

from __future__ import annotations

from collections.abc import Sequence

from cairnqd._jsoncodec import dump_json
from cairnqd.attempts import AttemptRecord
from cairnqd.store.arguments import require_str
from cairnqd.store.executor import Executor, Row, Session

#: How the attempts of a worker that stopped are named, by why it stopped: outcome and
#: detail. A stalled loop is an abort; any other stop (max_run of another task
#: included) hands the task back.
HAND_BACK_OUTCOMES = {
    "worker_exit": ("handed_back", "worker_exit"),
    "shutdown": ("handed_back", "shutdown"),
    "max_run": ("handed_back", "max_run"),
    "stall": ("aborted", "stall"),
}


class AttemptHistory:
    def __init__(self, executor: Executor) -> None:
        self._db = executor

    async def of(self, task_id: str) -> list[AttemptRecord]:
        """Every attempt of `task_id`, in the order they ran; empty for a task that
        ran before the history existed (or never ran)."""
        require_str(task_id, "task_id")
        rows = await self._db.fetch("extensions/attempts_of", {"task_id": task_id})
        return [AttemptRecord.from_row(r) for r in rows]


async def name_hand_back(
    session: Session, worker_id: str, released: Sequence[Row], why: str
) -> None:
    """Name the attempts `release_worker` just closed (`released`: its rows, in the
    same transaction) after why their worker stopped, one of `HAND_BACK_OUTCOMES`."""
    if why not in HAND_BACK_OUTCOMES:
        raise ValueError(f"why: expected one of {sorted(HAND_BACK_OUTCOMES)}, got {why!r}")
    items = [
        {"id": r["id"], "a": int(r["attempt"]), "s": r["status"]}
        for r in released
        if r["status"] != "canceled"
    ]
    if not items:
        return
    outcome, detail = HAND_BACK_OUTCOMES[why]
    await session.fetch(
        "extensions/attempts_hand_back",
        {"worker_id": worker_id, "items": dump_json(items), "outcome": outcome, "detail": detail},
    )


async def close_interrupted(
    session: Session, worker_id: str, interrupted: Sequence[tuple[str, int]]
) -> None:
    """Close, as `handed_back (operator)`, the records of the started attempts an
    operator's stop cut short and whose attempt `release_worker` gives back: they ran,
    so unlike an attempt given back unstarted they keep their record."""
    if not interrupted:
        return
    items = dump_json([{"id": task_id, "a": attempt} for task_id, attempt in interrupted])
    await session.fetch("extensions/attempts_interrupted", {"worker_id": worker_id, "items": items})


__all__ = ["HAND_BACK_OUTCOMES", "AttemptHistory", "close_interrupted", "name_hand_back"]
