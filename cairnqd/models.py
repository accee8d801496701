"""Rows as Python values: `Task`, `TaskRef`, `TaskDef` and the status vocabulary."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Generic, Literal, ParamSpec, TypeVar, get_args

from cairnqd._jsoncodec import (
    Undecodable,
    UndecodableText,
    load_json,
    undecodable_reason,
)
from cairnqd.errors import UndecodableRow

TaskStatus = Literal["queued", "running", "succeeded", "failed", "canceled"]
STATUSES: tuple[TaskStatus, ...] = get_args(TaskStatus)
TERMINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "canceled"})

Conflict = Literal["reuse", "reuse-succeeded", "reject", "replace"]
CONFLICTS: tuple[Conflict, ...] = get_args(Conflict)

P = ParamSpec("P")
R = TypeVar("R")


def is_terminal_status(status: str) -> bool:
    return status in TERMINAL_STATUSES


@dataclass(frozen=True)
class TaskDef(Generic[P, R]):
    """A typed handle on a task name; the type parameters exist for the checker only."""

    name: str


def task_name(task: str | TaskDef[Any, Any]) -> str:
    return task.name if isinstance(task, TaskDef) else task


@dataclass(frozen=True)
class TaskRef:
    id: str
    status: TaskStatus

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TaskRef:
        return cls(id=row["id"], status=row["status"])

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


# Columns that hold JSON, and columns that hold epoch milliseconds. Asserted against
# the migrations' DDL by tests/protocol, so a new column cannot slip past them.
JSON_COLUMNS = ("payload", "result", "error", "metadata")
MS_COLUMNS = (
    "lease_until_ms",
    "run_at_ms",
    "cancel_requested_at_ms",
    "created_at_ms",
    "updated_at_ms",
    "completed_at_ms",
)


@dataclass
class Task:
    """One `cairnq_tasks` row, JSON columns decoded. Field order is column order."""

    id: str
    name: str
    queue: str = "default"
    status: TaskStatus = "queued"
    payload: Any = None
    result: Any = None
    error: Any = None
    metadata: Any = None
    progress: float | None = None
    message: str | None = None
    attempt: int = 0
    max_attempts: int = 3
    priority: int = 0
    worker_id: str | None = None
    lease_until_ms: int | None = None
    run_at_ms: int = 0
    cancel_requested_at_ms: int | None = None
    parent_id: str | None = None
    root_id: str | None = None
    correlation_id: str | None = None
    created_at_ms: int = 0
    updated_at_ms: int = 0
    completed_at_ms: int | None = None

    @classmethod
    def from_row(
        cls,
        row: Mapping[str, Any],
        json_is_text: bool = True,
        *,
        take: bool = False,
        strict: bool = False,
    ) -> Task:
        """Build a Task from a driver row.

        `json_is_text` says how this driver hands over JSON columns: as text to parse
        (SQLite) or already decoded (psycopg's jsonb loader). Guessing from the value's
        type would parse a top-level JSON string twice, so the caller must know.
        Unknown columns are dropped, so a newer schema with extra columns still reads.
        `take`: the row is a dict nobody else uses (a store's fresh driver row), so a
        full one becomes the task's own attributes instead of being copied.

        A value that cannot be decoded (another client stored it) becomes an
        `Undecodable` marker in its field, or, with `strict` (a claim), raises
        UndecodableRow naming the column.
        """
        full = row.keys() == _FIELD_SET
        if full and take and type(row) is dict:
            values = row
        elif full:
            values = dict(row)
        else:
            values = {name: row[name] for name in _FIELD_NAMES if name in row}
        if json_is_text:
            # Costs nothing until a value fails; then `column` names it.
            try:
                for column in JSON_COLUMNS:
                    text = values.get(column)
                    if text is not None:
                        values[column] = load_json(text)
            except (ValueError, RecursionError, TypeError) as exc:
                _decode_rest(values, column, exc, strict)
        try:
            for column in MS_COLUMNS:
                value = values.get(column)
                if value is not None and not isinstance(value, int):
                    values[column] = int(value)
        except (ValueError, TypeError, OverflowError) as exc:
            _convert_rest(values, column, exc, strict)
        if full and cls is Task:
            # The common case (a full row of today's schema; a claim builds hundreds of
            # these per batch): the checked values become the attributes as they are,
            # a quarter of the cost of the keyword call.
            return adopt_task(values)
        return cls(**values)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def cancel_requested(self) -> bool:
        return self.cancel_requested_at_ms is not None

    @property
    def queued(self) -> bool:
        return self.status == "queued"

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    @property
    def canceled(self) -> bool:
        return self.status == "canceled"


def _decode_rest(values: dict[str, Any], failed: str, exc: BaseException, strict: bool) -> None:
    """After JSON column `failed` could not be decoded (those before it were): raise,
    or mark it and decode the columns after it, marking any other that fails."""
    if strict:
        raise _undecodable(failed, values[failed], exc)
    for column in JSON_COLUMNS[JSON_COLUMNS.index(failed) :]:
        text = values.get(column)
        if text is None:
            continue
        if column != failed:
            try:
                values[column] = load_json(text)
                continue
            except (ValueError, RecursionError, TypeError) as later:
                exc = later
        values[column] = _marker(text, exc)


def _convert_rest(values: dict[str, Any], failed: str, exc: BaseException, strict: bool) -> None:
    """After time column `failed` held no integer: raise, or leave each such value as
    it is (a read shows what is there)."""
    if strict:
        raise _undecodable(failed, values[failed], exc)
    for column in MS_COLUMNS[MS_COLUMNS.index(failed) :]:
        value = values.get(column)
        if value is not None and not isinstance(value, int):
            with contextlib.suppress(ValueError, TypeError, OverflowError):
                values[column] = int(value)


def _marker(value: Any, exc: BaseException) -> Undecodable:
    if isinstance(value, UndecodableText):
        return Undecodable(str(value), value.reason)
    return Undecodable(_as_text(value), undecodable_reason(exc))


def _as_text(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "backslashreplace")
    return str(value)


def _undecodable(column: str, value: Any, exc: BaseException) -> UndecodableRow:
    marker = value if isinstance(value, Undecodable) else _marker(value, exc)
    return UndecodableRow(column, marker.reason, marker.preview)


def undecodable_column(row: Mapping[str, Any]) -> UndecodableRow | None:
    """What makes a row its driver already decoded unusable, or None: a value the
    driver could not decode (`Undecodable`, `UndecodableText`), in the first column
    that holds one. For the rare fetch that made markers: it looks at every value."""
    for column, value in row.items():
        if isinstance(value, Undecodable | UndecodableText):
            return _undecodable(column, value, ValueError("not decodable"))
    return None


_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Task))
_FIELD_SET = frozenset(_FIELD_NAMES)


def adopt_task(values: dict[str, Any]) -> Task:
    """A Task whose attributes are `values`, which must hold every field, already in
    its final type, and belong to nobody else: `Task(**values)` without the call.
    Only for the hot paths that build thousands (claims, `submit_many`); a test
    keeps it equal to the constructor."""
    task = object.__new__(Task)
    task.__dict__ = values
    return task


TASK_COLUMNS = _FIELD_NAMES
