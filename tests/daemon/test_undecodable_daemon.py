"""A row the daemon cannot decode, in a real daemon: it is failed, counted in /metrics,
and every good task behind it runs.

Before, the group's claims failed on the same batch forever, 0 of 20 good tasks ran,
`/healthz` stayed 200 and only an `other` error counter climbed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon_faults import fault_config, submit, succeeded_count
from tests.support.harness import gauge, scrape
from tests.support.undecodable import POSTGRES_BAD, SQLITE_BAD, insert_bad
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

GOOD = 20


def test_the_daemon_fails_an_undecodable_row_counts_it_and_runs_the_rest(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    groups = {"g": {"queues": ["default"], "processes": 1, "concurrency": 4}}
    config = fault_config(tmp_path, dialect, db_target, groups)
    # The rows go in before the daemon starts; the bad one (priority 10) is drawn first.
    submit(dialect, db_target, "f.quick", [{"seconds": 0}] * GOOD, queue="default")
    bad = (
        SQLITE_BAD["payload-not-utf8"] if dialect == "sqlite" else POSTGRES_BAD["payload-5000-deep"]
    )
    # Named for a handler the group has: its claims draw it.
    insert_bad(dialect, db_target, dataclasses.replace(bad, name="f.quick"))
    daemon = daemon_factory(config).start()
    port = daemon.metrics_port()
    wait_for("every good task", lambda: succeeded_count(dialect, db_target) == GOOD, 60)

    def undecodable() -> float | None:
        return gauge(scrape(port), "cairnq_tasks_failed_total", reason="undecodable")

    assert wait_for("the metric", undecodable, 30, accept=lambda n: n == 1) == 1
    lines = [line for line in daemon.output().splitlines() if "failed without running" in line]
    assert len(lines) == 1, daemon.output()
    assert daemon.stop() == 0
