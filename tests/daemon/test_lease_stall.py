"""A database stall longer than the lease, on the real daemon: no task runs twice at once.

Another client holds SQLite's write lock, or a Postgres session holds `LOCK TABLE
cairnq_tasks`, for three times the lease while a long handler runs in a real child. Before
the fix the handler ran on, the lease ended, and once the lock went the task was
recovered and run again beside it (3 of 3 long tasks overlapped in a probe). Now:

- an async handler is cancelled before its lease can end; the task runs again later;
- a sync handler (its thread cannot be cancelled) gets its child aborted before the
  lease ends; the parent starts a new child and the task runs there.

Executions come from the handlers' own log (`fault_handlers.record`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon_faults import all_terminal, fault_config, submit
from tests.support.executions import Execution, executions, overlaps
from tests.support.locks import database_locked
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

LEASE_S = 3.0
HELD_S = 3 * LEASE_S


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _overlapping(runs: list[Execution]) -> list[tuple[Execution, Execution]]:
    """Pairs of executions of one task whose intervals meet. One without an end still
    runs if its process lives; if its process died, `overlaps` (written by the later
    execution when it started) says whether it was alive then."""

    def end(run: Execution) -> float | None:
        if run.ended is not None:
            return run.ended
        return math.inf if _alive(run.pid) else None

    pairs = []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            a_end, b_end = end(a), end(b)
            if a.task_id != b.task_id or a_end is None or b_end is None:
                continue
            if a.started < b_end and b.started < a_end:
                pairs.append((a, b))
    return pairs


@pytest.mark.parametrize("handler", ["f.patient", "f.stubborn"])
def test_a_stall_longer_than_the_lease_never_runs_a_task_twice_at_once(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any, handler: str
) -> None:
    log = tmp_path / "runs.log"
    groups = {"g": {"queues": ["q"], "processes": 2, "concurrency": 2, "lease": "3s"}}
    daemon = daemon_factory(fault_config(tmp_path, dialect, db_target, groups)).start()
    payload = {"log": str(log), "seconds": 30, "long_on": [1]}
    ids = submit(dialect, db_target, handler, [payload, payload], queue="q", max_attempts=3)
    wait_for("both tasks to start", lambda: len(executions(log)) >= 2, 60)
    with database_locked(dialect, db_target, HELD_S):
        pass
    done = wait_for("both tasks to finish", lambda: all_terminal(dialect, db_target, ids), 90)
    assert [t.status for t in done] == ["succeeded"] * 2, done
    runs = executions(log)
    assert overlaps(log) == [], "an attempt ran while the stalled one's process lived"
    assert _overlapping(runs) == []
    first = [r for r in runs if r.attempt == 1]
    assert len(first) == 2
    output = daemon.output()
    assert output.count("cancelling its handler before the lease can end") >= 2, output
    if handler == "f.stubborn":
        # The thread could not be stopped: its child exited before the lease ended.
        assert all(r.ended is None for r in first), runs
        assert "would run beside the next execution" in output
    else:
        assert all(r.ended is not None for r in first), runs
    assert daemon.stop() == 0
