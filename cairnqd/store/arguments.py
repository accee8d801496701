"""Argument checks for the store's operations, and `SubmitRequest`.

Each check names the argument, so a bad call is diagnosed where it was made, not by
a CHECK constraint deep in the driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from cairnqd._ids import new_task_id
from cairnqd._jsoncodec import dump_json_or_empty
from cairnqd.models import CONFLICTS, task_name

Params = dict[str, Any]


def require_str(value: Any, arg: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise ValueError(f"{arg} must be a non-empty string, got {value!r}")


def require_int(value: Any, arg: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{arg} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{arg} must be >= {minimum}, got {value}")
    return value


def check_status_filter(status: Any, arg: str, allowed: Sequence[str]) -> None:
    if status is not None and status not in allowed:
        raise ValueError(f"{arg} must be one of {', '.join(allowed)}; got {status!r}")


def optional_filters(params: Mapping[str, Any], names: Sequence[str]) -> frozenset[str]:
    """The optional filters a call actually set, for `_protocol.specialize`."""
    return frozenset(n for n in names if params.get(n) is not None)


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """One task to submit: `TaskStore.submit`'s arguments and their defaults, checked
    when the request is made so a bad one never reaches the database."""

    name: str
    payload: Any = None
    queue: str = "default"
    key: str | None = None
    conflict: str = "reuse"
    max_attempts: int = 3
    priority: int = 0
    metadata: Any = None
    parent_id: str | None = None
    root_id: str | None = None
    correlation_id: str | None = None
    delay_ms: int = 0

    def __post_init__(self) -> None:
        if self.conflict not in CONFLICTS:
            raise ValueError(
                f"conflict must be one of {', '.join(CONFLICTS)}; got {self.conflict!r}"
            )
        require_int(self.max_attempts, "max_attempts", minimum=1)
        require_int(self.delay_ms, "delay_ms", minimum=0)
        require_int(self.priority, "priority")
        require_str(self.name, "name")
        require_str(self.queue, "queue")
        require_str(self.key, "key", optional=True)
        require_str(self.parent_id, "parent_id", optional=True)
        require_str(self.root_id, "root_id", optional=True)
        require_str(self.correlation_id, "correlation_id", optional=True)

    @classmethod
    def from_mapping(cls, item: Mapping[str, Any]) -> SubmitRequest:
        """A request from a mapping of submit arguments (`submit_many`'s items); `name`
        may be a TaskDef. Unknown or missing arguments raise TypeError."""
        unknown = item.keys() - _ARGUMENTS
        if unknown:
            raise TypeError(f"unknown submit argument(s): {', '.join(sorted(unknown))}")
        if "name" not in item:
            raise TypeError("missing 'name'")
        return cls(**{**item, "name": task_name(item["name"])})

    def insert_params(self) -> Params:
        """The insert statements' parameters, under a new task id. JSON is encoded
        here, so a value JSON cannot carry fails before anything is written."""
        task_id = new_task_id()
        return {
            "id": task_id,
            "name": self.name,
            "queue": self.queue,
            "payload": dump_json_or_empty(self.payload, what="payload"),
            "metadata": dump_json_or_empty(self.metadata, what="metadata"),
            # The values themselves, for tasks built without reading the row back.
            "payload_value": {} if self.payload is None else self.payload,
            "metadata_value": {} if self.metadata is None else self.metadata,
            "max_attempts": self.max_attempts,
            "priority": self.priority,
            "parent_id": self.parent_id,
            "root_id": self.root_id if self.root_id is not None else task_id,
            "correlation_id": self.correlation_id,
            "delay_ms": self.delay_ms,
            "key": self.key,
            "conflict": self.conflict,
        }


_ARGUMENTS = frozenset(f.name for f in fields(SubmitRequest))

__all__ = [
    "SubmitRequest",
    "check_status_filter",
    "optional_filters",
    "require_int",
    "require_str",
]
