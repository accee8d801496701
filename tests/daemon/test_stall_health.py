"""`/healthz` sees a database that is locked: claims and renewals without progress.

Another client holds SQLite's write lock, or a Postgres session holds `LOCK TABLE
cairnq_tasks`, while a group has work to claim. Before, `/healthz` answered 200 the whole
time and nothing was logged at warning level on Postgres. Now, once the group's claims
and lease renewals have made no progress for 10 s, `/healthz` answers 503 naming the
group, the child logs one warning naming what blocks it, and both clear once the lock
goes. Real daemon, real lock holders, real HTTP scrapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cairnqd.daemon.wire.messages import STALL_WARN_S
from tests.support.daemon import healthz
from tests.support.daemon_faults import fault_config, submit, succeeded_count
from tests.support.locks import database_locked
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

HELD_S = STALL_WARN_S + 12


def test_healthz_names_a_group_whose_claims_stall_on_a_lock(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    groups = {"mail": {"queues": ["q"], "processes": 1, "concurrency": 2, "lease": "60s"}}
    daemon = daemon_factory(fault_config(tmp_path, dialect, db_target, groups)).start()
    port = daemon.metrics_port()
    assert healthz(port)[0] == 200
    # More quick tasks than the group runs in the test: it keeps claiming throughout.
    submit(dialect, db_target, "f.quick", [{"seconds": 0.05}] * 3000, queue="q")
    wait_for("the group to be draining", lambda: succeeded_count(dialect, db_target) > 0, 60)
    with database_locked(dialect, db_target, HELD_S, until_exit=True):
        stalled = "group mail: claims and lease renewals have made no progress"
        _, body = wait_for(
            "/healthz to turn 503 naming the group",
            lambda: healthz(port),
            STALL_WARN_S + 8,
            accept=lambda answer: answer[0] == 503 and stalled in " ".join(answer[1]["problems"]),
        )
        if dialect == "sqlite":
            # WAL readers need no write lock: the statistics keep coming meanwhile.
            assert len(body["problems"]) == 1, body
        warned = wait_for(
            "the stall warning",
            lambda: [line for line in daemon.output().splitlines() if "no progress for" in line],
            10,
        )
    assert len(warned) == 1, warned
    if dialect == "sqlite":
        assert "SQLite's write lock" in warned[0]
        assert "processes with the file open" in warned[0]
    else:
        assert "lock table cairnq_tasks in access exclusive mode" in warned[0], warned
        assert "idle in transaction" in warned[0]
    wait_for("/healthz to recover", lambda: healthz(port), 30, accept=lambda a: a[0] == 200)
    after = succeeded_count(dialect, db_target)
    wait_for("tasks to run again", lambda: succeeded_count(dialect, db_target) > after + 20, 60)
    assert daemon.stop() == 0
