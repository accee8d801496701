"""Stops the operator caused: the attempts they cut short are given back.

A roll, a resize or a removed group, a drain (TERM) that outlasts `shutdown_timeout`,
and QUIT end a child's running tasks for no fault of theirs. When the parent stopped a
child hard for one of those (and for nothing its tasks did: a stall, max_run, a lost
lease), the tasks the child had started go back to the queue with their attempt
restored, as the tasks it never started do. At most `OPERATOR_RESTORES` times per task,
counted in the database (`cairnqd_interruptions`), so a task that never finishes within
`shutdown_timeout` still ends after its usual attempts. The hand-back runs only once
the child has been reaped, so the next execution never overlaps this one.
docs/operations.md, "What a deploy does to running tasks", has the operator's side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cairnqd.daemon.parent.pool import ChildProcess

#: How many times one task's attempt is given back for an operator's stop. Three
#: absorbs a deploy, its rollback and the fix landing on one long task; past it the
#: interruptions count as attempts again, so a task that can never finish within
#: `shutdown_timeout` runs at most this many more times than `max_attempts` allows.
OPERATOR_RESTORES = 3


def operator_stopped(child: ChildProcess) -> bool:
    """Whether the parent stopped `child` hard (QUIT, then SIGKILL) because the operator
    asked for a stop: a drain that reached `shutdown_timeout` (a roll, a resize, a
    removed group, TERM) or QUIT. An abort for a stall, max_run or a silent heartbeat
    sets `kill_reason` and is no operator's doing; a child that died on its own while
    draining was never sent QUIT."""
    return child.quit_sent_at is not None and child.kill_reason is None


__all__ = ["OPERATOR_RESTORES", "operator_stopped"]
