"""A single keyless submit builds its task from what it inserted rather than reading the
row back (`TaskStore._insert_one`): what it hands back must be exactly what the database
stored, for every argument and awkward value, on both dialects."""

from __future__ import annotations

import time
from typing import Any

import pytest

from cairnqd.store.base import TaskStore

ARGUMENTS: list[dict[str, Any]] = [
    {"name": "plain"},
    {"name": "payload", "payload": {"i": 1, "nested": [1, {"k": None}], "f": 1.5}},
    {"name": "scalar payload", "payload": "just text"},
    {"name": "list payload", "payload": [1, "two", None, True]},
    {"name": "text", "payload": {"t": 'q"uote \\ back\ttab\nline \u00e9 \U0001f600'}},
    {"name": "delayed", "delay_ms": 60_000, "priority": -5, "max_attempts": 1},
    {"name": "limits", "priority": 2**31 - 1, "max_attempts": 2**31 - 1},
    {"name": "queue", "queue": "gpu\u00e9", "metadata": {"who": "me", "n": [1, 2]}},
    {
        "name": "ids",
        "parent_id": "task_parent",
        "root_id": "task_root",
        "correlation_id": "corr\t1",
    },
]


@pytest.mark.parametrize("arguments", ARGUMENTS, ids=[a["name"] for a in ARGUMENTS])
async def test_a_single_submit_hands_back_what_was_stored(
    store: TaskStore, arguments: dict[str, Any]
) -> None:
    before_ms = int(time.time() * 1000)
    task = await store.submit(**arguments)
    stored = await store.get(task.id)
    assert stored == task
    assert task.status == "queued" and task.attempt == 0
    assert task.created_at_ms == task.updated_at_ms >= before_ms - 1_000
    assert task.run_at_ms == task.created_at_ms + arguments.get("delay_ms", 0)
    assert task.root_id == arguments.get("root_id", task.id)
