"""The scheduler's log through an outage, in process: once at its start, once at its
end (the daemon-level test through a TCP fault proxy: tests/faults/test_scheduler_outage.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cairnqd.config import load_config
from cairnqd.daemon.parent.metrics import Metrics
from cairnqd.daemon.parent.scheduler import Scheduler
from cairnqd.errors import DatabaseUnavailable

CONFIG = """\
version: 1
database: {path: tasks.db}
handlers: [cairnqd.demo:registry]
metrics: {listen: off}
schedules:
  tick: {name: demo.echo, every: 1m}
groups:
  web: {queues: [default]}
"""


def test_an_outage_is_logged_once_and_its_end_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "cairnq.yaml"
    path.write_text(CONFIG)
    config = load_config(path, {})
    scheduler = Scheduler(config, Metrics(config))
    caplog.set_level(logging.DEBUG, logger="cairnqd.scheduler")
    for _ in range(5):
        scheduler._count_db_error(DatabaseUnavailable("cannot connect to Postgres: refused"))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "quietly until the database answers" in warnings[0].message
    assert scheduler.database_problem() is not None
    scheduler._answered()
    ends = [r.message for r in caplog.records if "answers again" in r.message]
    assert len(ends) == 1 and "(4 more failed passes not logged)" in ends[0]
    scheduler._answered()  # no outage: nothing more
    assert len([r for r in caplog.records if "answers again" in r.message]) == 1
    # An error the database answered with is no outage: logged every time.
    scheduler._count_db_error(ValueError("a bad row"))
    scheduler._count_db_error(ValueError("a bad row"))
    assert len([r for r in caplog.records if "a bad row" in r.message]) == 2
