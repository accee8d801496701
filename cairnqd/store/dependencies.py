"""Task dependencies, the store's side (docs/workflows.md).

A task submitted `after` others is inserted as usual, then, in the same transaction,
its edges (`dependency_link`), its ancestors (`dependency_closure`) and, when a parent
has not succeeded yet or an ancestor already failed, its wait row (`dependency_wait`)
are written and the task is held (`dependency_hold`): queued but due at `WAITING_RUN_AT`,
or canceled at once. Everything after that is done by the triggers of migration
`cairnqd_0013_dependencies.sql`, in whichever transaction settles or retries a parent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cairnqd.models import Task
from cairnqd.store.arguments import require_str
from cairnqd.store.executor import Session

#: The run_at_ms of a task waiting on its dependencies: 9999-12-31T00:00Z, later than any
#: clock, exact as a JavaScript number (the TypeScript SDK reads it as one) and still a
#: date every reader can format (Python's datetime ends with year 9999, JavaScript's
#: Date at 8.64e15 ms; 2^53 - 1 would be past both and break any display of the task).
WAITING_RUN_AT = 253_402_214_400_000

#: The most tasks a graph read returns (inspect --tree, the dashboard's graph).
GRAPH_LIMIT = 2_000

#: An `after` entry of a `submit_many` item: an earlier item's index, or a task id.
ItemRef = int | str


def parent_id(ref: Any, where: str) -> str:
    """The task id `ref` names (an id, or a `Task`/`TaskRef`); TypeError else."""
    task_id = getattr(ref, "id", ref) if not isinstance(ref, str) else ref
    if not isinstance(task_id, str):
        raise TypeError(f"{where} must name tasks by id or Task, got {type(ref).__name__}")
    require_str(task_id, where)
    return task_id


def parent_ids(after: Any, where: str = "after") -> list[str]:
    """`after` as distinct task ids in the order named (a repeat is dropped)."""
    if isinstance(after, str | bytes) or not isinstance(after, Sequence):
        raise TypeError(f"{where} must be a list of tasks or task ids")
    return list(dict.fromkeys(parent_id(ref, f"{where}[{i}]") for i, ref in enumerate(after)))


def item_refs(items: Sequence[Any]) -> list[list[ItemRef]] | None:
    """The `after` of each `submit_many` item (index refs checked to name an earlier
    item), or None when no item has one. Raises naming the item."""
    refs: list[list[ItemRef]] = []
    found = False
    for index, item in enumerate(items):
        after = item.get("after") if isinstance(item, Mapping) else None
        if after is None:
            refs.append([])
            continue
        where = f"tasks[{index}].after"
        if isinstance(after, str | bytes) or not isinstance(after, Sequence):
            raise TypeError(f"{where} must be a list of item indexes, tasks or task ids")
        mine: list[ItemRef] = []
        for n, ref in enumerate(after):
            if isinstance(ref, int) and not isinstance(ref, bool):
                if not 0 <= ref < index:
                    raise ValueError(
                        f"{where}[{n}] refers to tasks[{ref}]: an item may only wait for "
                        f"earlier items of the list (0 to {index - 1})"
                    )
                ref_or_id: ItemRef = ref
            else:
                ref_or_id = parent_id(ref, f"{where}[{n}]")
            if ref_or_id not in mine:
                mine.append(ref_or_id)
        found = found or bool(mine)
        refs.append(mine)
    return refs if found else None


def without_after(items: Sequence[Any]) -> list[Any]:
    """The items with their `after` taken out (the insert knows nothing of it)."""
    return [
        {k: v for k, v in item.items() if k != "after"} if isinstance(item, Mapping) else item
        for item in items
    ]


def missing_parent(where: str, task_id: str) -> ValueError:
    """The error for an `after` naming no task: never submitted, or purged since (a
    parent must exist when its dependent is submitted)."""
    return ValueError(f"{where} names {task_id}, which is not a task (never submitted, or purged)")


async def missing_parents(session: Session, ids: Sequence[str]) -> list[str]:
    """Those of `ids` with no task, in the order given. Postgres locks the others until
    the transaction ends, so none settles unseen between this read and the edges."""
    if not ids:
        return []
    found = {row["id"] for row in await session.fetch("dependency_parents", {"ids": list(ids)})}
    return [task_id for task_id in ids if task_id not in found]


async def hold(session: Session, task_id: str, parents: Sequence[str]) -> Mapping[str, Any] | None:
    """Write the edges of new task `task_id` and hold it if it must wait; the held row,
    or None when every parent had already succeeded (the task stays as inserted)."""
    params = {"task_id": task_id, "parents": list(parents)}
    await session.fetch("dependency_link", params)
    await session.fetch("dependency_closure", params)
    waits = await session.fetch("dependency_wait", params)
    if not waits:
        return None
    rows = await session.fetch("dependency_hold", {**params, "failed_by": waits[0]["failed_by"]})
    return rows[0]


def state_shown(status: str, run_at_ms: int) -> str:
    """A task's status as the operator's tools show it: `waiting` for a queued task
    held by its dependencies (its run_at is the marker), else the status."""
    return "waiting" if status == "queued" and run_at_ms == WAITING_RUN_AT else status


def is_waiting(task: Task) -> bool:
    """Whether `task` is queued behind its dependencies."""
    return state_shown(task.status, task.run_at_ms) == "waiting"


@dataclass(frozen=True)
class GraphNode:
    """One task of a dependency graph, with the parents its submit named, in order."""

    id: str
    name: str
    queue: str
    status: str
    attempt: int
    max_attempts: int
    run_at_ms: int
    updated_at_ms: int
    after: tuple[str, ...] = ()

    @property
    def state(self) -> str:
        """The status, or `waiting` for a queued task held by its dependencies."""
        return state_shown(self.status, self.run_at_ms)

    @property
    def waiting(self) -> bool:
        """Queued behind its dependencies, not yet due."""
        return self.state == "waiting"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "queue": self.queue,
            "status": self.status,
            "waiting": self.waiting,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "after": list(self.after),
        }


@dataclass(frozen=True)
class TaskGraph:
    """The tasks of one dependency graph in id order (submit order, since ids grow),
    cut at a limit when `truncated`. A parent outside `nodes` (purged, or past the
    cut) is still named in its dependents' `after`."""

    nodes: list[GraphNode]
    truncated: bool = False
    by_id: dict[str, GraphNode] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_id", {n.id: n for n in self.nodes})

    @classmethod
    def from_rows(
        cls, nodes: Sequence[Mapping[str, Any]], edges: Sequence[Mapping[str, Any]], *,
        truncated: bool = False,
    ) -> TaskGraph:  # fmt: skip
        after: dict[str, list[str]] = {}
        for edge in edges:  # ordered by task, then position
            after.setdefault(edge["task_id"], []).append(edge["parent_id"])
        return cls(
            [
                GraphNode(
                    id=row["id"],
                    name=row["name"],
                    queue=row["queue"],
                    status=row["status"],
                    # As stored (as `TaskSummary.from_row` keeps them).
                    attempt=row["attempt"],
                    max_attempts=row["max_attempts"],
                    run_at_ms=row["run_at_ms"],
                    updated_at_ms=row["updated_at_ms"],
                    after=tuple(after.get(row["id"], ())),
                )
                for row in nodes
            ],
            truncated,
        )

    def roots(self) -> list[GraphNode]:
        """The tasks that wait for no task of this graph."""
        return [n for n in self.nodes if not any(p in self.by_id for p in n.after)]

    def children(self) -> dict[str, list[GraphNode]]:
        """Each task's dependents within the graph, in id order."""
        out: dict[str, list[GraphNode]] = {n.id: [] for n in self.nodes}
        for node in self.nodes:
            for parent in node.after:
                if parent in out:
                    out[parent].append(node)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"tasks": [n.to_json() for n in self.nodes], "truncated": self.truncated}


__all__ = [
    "GRAPH_LIMIT",
    "WAITING_RUN_AT",
    "GraphNode",
    "ItemRef",
    "TaskGraph",
    "hold",
    "is_waiting",
    "item_refs",
    "missing_parent",
    "missing_parents",
    "parent_id",
    "parent_ids",
    "state_shown",
    "without_after",
]
