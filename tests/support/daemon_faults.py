"""What the daemon's fault-path suites share: a config running the fault handlers,
submitting to and reading back from its database, and another client holding the lock
every write needs (a database stall)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cairnqd import CairnQ
from tests.support.daemon import base_config
from tests.support.harness import client_call, database_section

HANDLERS = ["tests.daemon.fault_handlers:registry"]


def fault_config(
    tmp_path: Path, dialect: str, target: str, groups: dict[str, Any], **supervisor: str
) -> dict[str, Any]:
    config = base_config(tmp_path, database_section(dialect, target), groups)
    config["handlers"] = HANDLERS
    config["supervisor"].update(supervisor)
    return config


def submit(
    dialect: str, target: str, name: str, payloads: list[dict[str, Any]], **opts: Any
) -> list[str]:
    async def go(c: CairnQ) -> list[str]:
        tasks = await c.submit_many([{"name": name, "payload": p, **opts} for p in payloads])
        return [t.id for t in tasks]

    ids: list[str] = client_call(dialect, target, go)
    return ids


def tasks(dialect: str, target: str, ids: list[str]) -> list[Any]:
    async def go(c: CairnQ) -> list[Any]:
        return [await c.get(i) for i in ids]

    found: list[Any] = client_call(dialect, target, go)
    return found


def all_terminal(dialect: str, target: str, ids: list[str]) -> list[Any] | None:
    found = tasks(dialect, target, ids)
    done = all(t is not None and t.status in ("succeeded", "failed", "canceled") for t in found)
    return found if done else None


def terminal_count(dialect: str, target: str) -> int:
    counts = client_call(dialect, target, lambda c: c.stats())
    return sum(
        n for q in counts.values() for status, n in q.items() if status not in ("queued", "running")
    )


def succeeded_count(dialect: str, target: str) -> int:
    counts = client_call(dialect, target, lambda c: c.stats())
    return sum(q.get("succeeded", 0) for q in counts.values())
