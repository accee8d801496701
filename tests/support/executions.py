"""Reading the execution log the fault handlers write (`fault_handlers.record`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Execution:
    task_id: str
    attempt: int
    pid: int
    started: float
    ended: float | None  # None: the process died before the handler returned


def executions(log: Path) -> list[Execution]:
    if not log.exists():
        return []
    starts: dict[tuple[str, int, int], float] = {}
    ends: dict[tuple[str, int, int], float] = {}
    for line in log.read_text().splitlines():
        what, task_id, attempt, pid, at = line.split()
        if what == "overlap":
            continue
        key = (task_id, int(attempt), int(pid))
        (starts if what == "start" else ends)[key] = float(at)
    return [Execution(k[0], k[1], k[2], t, ends.get(k)) for k, t in starts.items()]


def overlaps(log: Path) -> list[str]:
    """The `overlap` records: an execution that began while an earlier attempt's
    process was still alive."""
    if not log.exists():
        return []
    return [line for line in log.read_text().splitlines() if line.startswith("overlap ")]
