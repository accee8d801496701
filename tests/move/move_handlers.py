"""Handlers a daemon on a move's target loads (`tests.move.move_handlers:registry`): one
for every task name the moved source holds, each returning at once."""

from __future__ import annotations

from typing import Any

from cairnqd.registry import TaskRegistry

registry = TaskRegistry()

NAMES = ("job.queued", "job.keyed", "job.again", "job.nightly", "job.bulk", "job.later")


def _done(ctx: Any, payload: Any) -> str:
    return "ran on the target"


for _name in NAMES:
    registry.task(_name)(_done)
