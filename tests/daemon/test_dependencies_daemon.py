"""Task dependencies under real daemons, on both dialects (docs/workflows.md).

The release of a dependent happens in the transaction that settles its last parent, so
neither a child killed while it runs that parent nor two daemons settling the parents
of the same fan-ins at once can lose a release or make one twice: each dependent runs
exactly once, after all its parents succeeded.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.support.daemon import Daemon
from tests.support.daemon_faults import all_terminal, fault_config, tasks
from tests.support.executions import executions
from tests.support.harness import client_call
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def _submit_graph(dialect: str, target: str, items: list[dict[str, Any]]) -> list[str]:
    async def go(c: CairnQ) -> list[str]:
        return [t.id for t in await c.submit_many(items)]

    ids: list[str] = client_call(dialect, target, go)
    return ids


def _starts(log: Path, task_id: str) -> list[int]:
    """The pids that started `task_id`, in order."""
    return [e.pid for e in executions(log) if e.task_id == task_id]


def test_a_sigkill_of_the_child_running_the_last_parent_neither_loses_nor_doubles_the_release(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    log, release = tmp_path / "runs.log", tmp_path / "release"
    groups = {"g": {"queues": ["q"], "processes": 2, "concurrency": 2}}
    daemon = daemon_factory(fault_config(tmp_path, dialect, db_target, groups)).start()
    quick = {"name": "f.quick", "queue": "q", "payload": {"log": str(log)}}
    gated = {"name": "f.gate", "queue": "q", "payload": {"log": str(log), "release": str(release)}}
    first, second, last, join = _submit_graph(
        dialect,
        db_target,
        [quick, quick, gated, {**quick, "after": [0, 1, 2], "max_attempts": 1}],
    )
    wait_for("the quick parents", lambda: all_terminal(dialect, db_target, [first, second]), 30)
    (pid,) = wait_for("the last parent to start", lambda: _starts(log, last), 30)
    assert _starts(log, join) == [], "the join waits for its last parent"

    os.kill(pid, signal.SIGKILL)
    release.touch()
    done = wait_for("the graph to end", lambda: all_terminal(dialect, db_target, [last, join]), 60)
    assert [t.status for t in done] == ["succeeded", "succeeded"]
    assert done[0].attempt == 2, "the killed attempt counted, the next one succeeded"
    starts = _starts(log, join)
    assert len(starts) == 1, f"the join ran {len(starts)} times"
    assert pid not in starts
    assert daemon.stop() == 0


def test_two_daemons_settling_the_parents_of_shared_fan_ins_release_each_once(
    tmp_path: Path, dialect: str, db_target: str
) -> None:
    """Two daemons (two hosts, to the database) each run one half of every fan-in's
    parents at the same moment; each join runs once, after its last parent."""
    log, release = tmp_path / "runs.log", tmp_path / "release"
    fans, width = 20, 10
    items: list[dict[str, Any]] = []
    for _ in range(fans):
        base = len(items)
        for i in range(width):
            queue = "left" if i % 2 == 0 else "right"
            payload = {"log": str(log), "release": str(release)}
            items.append({"name": "f.gate", "queue": queue, "payload": payload})
        items.append(
            {
                "name": "f.quick",
                "queue": "join",
                "payload": {"log": str(log)},
                "after": list(range(base, base + width)),
            }
        )
    ids = _submit_graph(dialect, db_target, items)
    joins = ids[width :: width + 1]
    parents = [i for i in ids if i not in set(joins)]

    daemons: list[Daemon] = []
    try:
        for side in ("left", "right"):
            groups = {"g": {"queues": [side, "join"], "processes": 1, "concurrency": 100}}
            home = tmp_path / side
            home.mkdir()
            daemons.append(Daemon(home, fault_config(home, dialect, db_target, groups)).start())
        # Every parent held open in its handler on both daemons, then all let go at once.
        wait_for("every parent to start", lambda: len(executions(log)) >= len(parents), 60)
        release.touch()
        done = wait_for("every join", lambda: all_terminal(dialect, db_target, joins), 60)
        assert {t.status for t in done} == {"succeeded"}
        for join in joins:
            runs = _starts(log, join)
            assert len(runs) == 1, f"join {join} ran {len(runs)} times"
        pids = {e.pid for e in executions(log) if e.task_id in set(parents)}
        assert len(pids) == 2, "both daemons settled parents"
        assert all(t.status == "succeeded" for t in tasks(dialect, db_target, parents))
    finally:
        for daemon in daemons:
            assert daemon.stop() == 0
