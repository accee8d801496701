"""Attempt history: one record per attempt of a task (`cairnqd_attempts`), kept by
triggers on the protocol's task table so every worker's attempts are recorded, and how
an attempt count reads beside its budget (docs/operations.md, "Reading attempt
history")."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: How an attempt ended; None while it runs.
OUTCOMES = ("succeeded", "failed", "canceled", "lease_lost", "aborted", "handed_back")

#: What each outcome means, for the text and the dashboard.
OUTCOME_MEANINGS = {
    "succeeded": "the handler returned",
    "failed": "the handler raised (the error below)",
    "canceled": "a cancel was requested and honoured",
    "lease_lost": "its lease expired and another claim recovered the task",
    "aborted": "the runtime stopped it",
    "handed_back": "its worker stopped and gave the task back",
    None: "still running",
}


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of one task, as its record holds it."""

    task_id: str
    attempt: int
    worker_id: str | None
    started_at_ms: int
    finished_at_ms: int | None
    outcome: str | None
    #: Which abort or hand-back: max_run, stall, worker_exit, shutdown, operator (a stop
    #: that gave the attempt back); else None.
    detail: str | None
    #: The envelope this attempt's failure wrote (with its traceback), if any.
    error: dict[str, Any] | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> AttemptRecord:
        error = row["error"]
        if isinstance(error, str | bytes):
            # SQLite keeps JSON as text; a value that is not JSON (or nests deeper than
            # the decoder goes) is shown as it is.
            try:
                error = json.loads(error)
            except (ValueError, RecursionError):
                error = {"message": error if isinstance(error, str) else repr(error)}
        return cls(
            task_id=str(row["task_id"]),
            # The history's triggers copy the attempt and times from the task's row, so
            # another client's text reaches them too: kept as stored, for the reader to
            # show (as `TaskSummary.from_row` does).
            attempt=row["attempt"],
            worker_id=None if row["worker_id"] is None else str(row["worker_id"]),
            started_at_ms=row["started_at_ms"],
            finished_at_ms=row["finished_at_ms"],
            outcome=None if row["outcome"] is None else str(row["outcome"]),
            detail=None if row["detail"] is None else str(row["detail"]),
            error=error if isinstance(error, dict) else None,
        )

    @property
    def host(self) -> str | None:
        """The host the attempt ran on, when its worker id names one: a cairnqd daemon
        names its workers `host:group.slot:id`. None for any other id (a `Worker` in
        an application, a public-SDK worker): the host is then unknown."""
        return host_of(self.worker_id)

    def duration_ms(self, now_ms: int) -> int:
        """How long it ran; a running attempt counts until `now_ms`."""
        end = self.finished_at_ms if self.finished_at_ms is not None else now_ms
        return max(0, end - self.started_at_ms)

    @property
    def outcome_shown(self) -> str:
        """The outcome with its detail: `aborted (stall)`, `running`."""
        name = self.outcome or "running"
        return f"{name} ({self.detail})" if self.detail else name

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "worker_id": self.worker_id,
            "host": self.host,
            "started_at_ms": self.started_at_ms,
            "finished_at_ms": self.finished_at_ms,
            "outcome": self.outcome,
            "detail": self.detail,
            "error": self.error,
        }


def error_attempt(error: object, records: Sequence[AttemptRecord]) -> int | None:
    """The attempt whose envelope a task's row holds (the last one with it), or None
    when the history does not say."""
    if error is None:
        return None
    for record in reversed(records):
        if record.error == error:
            return record.attempt
    return None


def error_label(status: str, which: int | None) -> str | None:
    """What the row's error is, when it is not simply why the task ended: a task that
    succeeded, or runs again, keeps the envelope of an earlier attempt."""
    attempt = f"attempt {which}" if which is not None else "an earlier attempt"
    if status == "succeeded":
        return f"left by {attempt}; the task succeeded afterwards"
    if status in ("queued", "running"):
        return f"of {attempt}; the task runs again"
    return None if which is None else f"of attempt {which}"


def host_of(worker_id: str | None) -> str | None:
    if worker_id is None or ":" not in worker_id:
        return None
    host = worker_id.split(":", 1)[0]
    return host or None


def attempts_shown(attempt: int, max_attempts: int) -> str:
    """`2/3`; past the budget (a retry by hand keeps the count and runs once more)
    `4 (3 allowed + 1 retried)` rather than a puzzling `4/3`."""
    if attempt <= max_attempts:
        return f"{attempt}/{max_attempts}"
    return f"{attempt} ({max_attempts} allowed + {attempt - max_attempts} retried)"


def duration_shown(ms: int) -> str:
    """`850ms`, `12.4s`, `3m05s`, `2h07m`."""
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def error_traceback(error: Mapping[str, Any] | None) -> str | None:
    """The traceback an envelope carries in its details, if any."""
    if not error:
        return None
    details = error.get("details")
    trace = details.get("traceback") if isinstance(details, Mapping) else None
    return trace if isinstance(trace, str) else None


__all__ = [
    "OUTCOMES",
    "OUTCOME_MEANINGS",
    "AttemptRecord",
    "attempts_shown",
    "duration_shown",
    "error_attempt",
    "error_label",
    "error_traceback",
    "host_of",
]
