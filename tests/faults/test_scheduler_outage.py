"""The scheduler through a database outage: one warning when it starts, one line when
it ends, and nothing in between (a pass a second used to log a line a second)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.faults.proxy import FaultProxy
from tests.support.daemon import base_config
from tests.support.harness import gauge, scrape
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_a_scheduler_outage_is_one_warning_then_one_line_when_it_ends(
    tmp_path: Path, pg_dsn: str, pg_proxy: FaultProxy, daemon_factory: Any
) -> None:
    database = {"dsn": pg_proxy.dsn(pg_dsn), "auto_migrate": True, "connect_timeout": "2s"}
    config = base_config(tmp_path, database, {"g": {"queues": ["q"], "processes": 1}})
    config["schedules"] = {"tick": {"name": "t.echo", "queue": "q", "every": "1s"}}
    daemon = daemon_factory(config).start()
    wait_for("a first slot enqueued", lambda: "schedule tick: slot" in daemon.output(), 30)
    pg_proxy.reset()  # every connection reset, and every new one
    wait_for(
        "the outage's one warning",
        lambda: "scheduler pass failed (connect)" in daemon.output(),
        timeout=30,
    )
    port = daemon.metrics_port()

    def failed_passes() -> float:
        labels = {"component": "scheduler", "kind": "connect"}
        return gauge(scrape(port), "cairnq_db_errors_total", **labels) or 0.0

    # Several passes fail meanwhile, one a second, each counted and none logged.
    wait_for("three failed passes", lambda: failed_passes() >= 3, timeout=30)
    pg_proxy.forward()
    wait_for(
        "the scheduler's recovery line",
        lambda: "scheduler: the database answers again after" in daemon.output(),
        timeout=60,
    )
    log = daemon.output()
    assert log.count("scheduler pass failed") == 1, log
    assert daemon.stop() == 0
