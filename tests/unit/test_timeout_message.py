"""What `TaskTimeout` says about the task it gave up on: its attempts read as everywhere
else (`attempts_shown`), also past the budget a retry by hand leaves behind."""

from __future__ import annotations

from cairnqd.errors import TaskTimeout
from cairnqd.models import Task


def test_a_running_task_within_its_budget_reads_as_a_fraction() -> None:
    task = Task(id="t1", name="n", status="running", attempt=2, max_attempts=3)
    assert str(TaskTimeout("t1", timeout_ms=50, task=task)) == (
        "task t1 did not finish within 50ms: still running (attempt 2/3)"
    )


def test_a_task_retried_past_its_budget_says_how_the_count_came_about() -> None:
    task = Task(id="t1", name="n", status="running", attempt=2, max_attempts=1)
    message = str(TaskTimeout("t1", timeout_ms=50, task=task))
    assert message.endswith("still running (attempt 2 (1 allowed + 1 retried))"), message
    queued = Task(id="t2", name="n", status="queued", attempt=4, max_attempts=3, run_at_ms=0)
    message = str(TaskTimeout("t2", timeout_ms=50, task=queued))
    assert "still queued (attempt 4 (3 allowed + 1 retried))" in message, message
