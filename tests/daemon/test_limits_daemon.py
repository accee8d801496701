"""Flow-control limits kept by real daemon children: two groups (separate processes,
each its own connection) share one budget, the most executions at once never passes
the limit, and an unlimited queue served by the same children drains meanwhile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.support.daemon import base_config
from tests.support.executions import Execution, executions
from tests.support.harness import client_call, database_section, gauge, scrape
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def most_at_once(runs: list[Execution]) -> int:
    events = sorted(
        [(r.started, 1) for r in runs] + [(r.ended, -1) for r in runs if r.ended is not None]
    )
    most = now = 0
    for _, step in events:  # an end at the same instant as a start sorts first
        now += step
        most = max(most, now)
    return most


def test_two_groups_share_one_concurrency_budget(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    groups = {
        name: {"queues": ["email", "other"], "processes": 1, "concurrency": 4, "prefetch": 0}
        for name in ("a", "b")
    }
    config = base_config(tmp_path, database_section(dialect, db_target), groups)
    config["handlers"] = ["tests.daemon.fault_handlers:registry"]
    config["limits"] = {"smtp": {"queues": ["email"], "concurrency": 2}}
    daemon = daemon_factory(config).start()
    limited, free = tmp_path / "limited.log", tmp_path / "free.log"

    async def submit(client: CairnQ) -> list[str]:
        ids = []
        for queue, log, seconds in (("email", limited, 0.2), ("other", free, 0.05)):
            for _ in range(12):
                payload = {"log": str(log), "seconds": seconds}
                ids.append((await client.submit("f.quick", payload, queue=queue)).id)
        return ids

    ids = client_call(dialect, db_target, submit)

    def unfinished() -> int:
        async def count(client: CairnQ) -> int:
            tasks = [await client.get(i) for i in ids]
            return sum(1 for t in tasks if t is None or t.status != "succeeded")

        return int(client_call(dialect, db_target, count))

    wait_for("every task to succeed", lambda: unfinished() == 0, timeout=90)
    metrics = scrape(daemon.metrics_port())
    assert gauge(metrics, "cairnq_limit_capacity", limit="smtp") == 2.0
    assert gauge(metrics, "cairnq_limit_in_use", limit="smtp") == 0.0
    assert gauge(metrics, "cairnq_limit_waiting", limit="smtp") == 0.0
    assert gauge(metrics, "cairnq_limit_bypassed", limit="smtp") == 0.0
    runs = executions(limited)
    assert len(runs) == 12
    assert most_at_once(runs) == 2  # never more, and the budget was used in full
    # The unlimited queue was not held behind the full budget: it finished while the
    # limited one, at two at a time, was still going.
    last_free = max(r.ended or 0.0 for r in executions(free))
    last_limited = max(r.ended or 0.0 for r in runs)
    assert last_free < last_limited
