"""Flow-control limits kept by real daemon children: two groups (separate processes,
each its own connection) share one budget, the most executions at once never passes
the limit, and an unlimited queue served by the same children drains meanwhile."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.support.daemon import Daemon, base_config
from tests.support.daemon_faults import all_terminal, fault_config, submit
from tests.support.executions import Execution, executions
from tests.support.harness import client_call, database_section, gauge, scrape
from tests.support.waiting import wait_for
from tests.support.worker import pg_listen_queries

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


def _gated(tmp_path: Path, dialect: str, db_target: str, n: int, queue: str = "email") -> Any:
    """`n` tasks that each run until the file `release` exists; their log, the file."""
    log, release = tmp_path / "gated.log", tmp_path / "release"
    payload = {"log": str(log), "release": str(release)}
    ids = submit(dialect, db_target, "f.gate", [payload] * n, queue=queue)
    return ids, log, release


def test_a_reload_changes_a_limit_without_restarting_a_child(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    groups = {"g": {"queues": ["email"], "processes": 2, "concurrency": 4, "prefetch": 0}}
    config = fault_config(tmp_path, dialect, db_target, groups)
    config["limits"] = {"smtp": {"queues": ["email"], "concurrency": 1}}
    daemon = daemon_factory(config).start()
    children = set(daemon.children("g"))
    ids, log, release = _gated(tmp_path, dialect, db_target, 6)
    port = daemon.metrics_port()
    wait_for(
        "one task running and five waiting for room",
        lambda: (
            len(executions(log)) == 1
            and gauge(scrape(port), "cairnq_limit_waiting", limit="smtp") == 5.0
        ),
        timeout=60,
    )
    config["limits"]["smtp"]["concurrency"] = 3
    daemon.write_config(config)
    done = daemon.cli("reload", "--wait", "30s")
    assert done.returncode == 0, done.stderr
    assert "limits.smtp.concurrency" in daemon.output()
    wait_for("three tasks running", lambda: len(executions(log)) == 3, timeout=30)
    assert set(daemon.children("g")) == children  # applied in place: no child rolled
    wait_for(
        "the capacity gauge to follow",
        lambda: gauge(scrape(port), "cairnq_limit_capacity", limit="smtp") == 3.0,
    )
    release.touch()
    wait_for("every task to finish", lambda: all_terminal(dialect, db_target, ids), timeout=60)
    assert most_at_once(executions(log)) == 3
    assert daemon.output().count("limits reloaded: smtp") >= 3  # the parent and both children
    assert daemon.stop() == 0


def test_a_killed_child_gives_its_room_back_at_once(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    """Not after its lease (a minute here): the parent hands the dead child's task back
    as it reaps it, and the next claim that finds the budget short frees the slot."""
    groups = {
        "g": {"queues": ["email"], "processes": 2, "concurrency": 2, "prefetch": 0, "lease": "60s"}
    }
    config = fault_config(tmp_path, dialect, db_target, groups)
    config["limits"] = {"smtp": {"queues": ["email"], "concurrency": 1}}
    daemon = daemon_factory(config).start()
    ids, log, release = _gated(tmp_path, dialect, db_target, 2)
    wait_for("the first task to start", lambda: len(executions(log)) == 1, timeout=60)
    (holder,) = executions(log)
    os.kill(holder.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    release.touch()  # from now on every run ends at once: only the room holds them back
    wait_for("both tasks to succeed", lambda: all_terminal(dialect, db_target, ids), timeout=60)
    later = [r for r in executions(log) if r.started > killed_at]
    assert later, "nothing ran after the kill"
    # Well inside the 60 s lease: the room came back with the hand-back.
    assert min(r.started for r in later) - killed_at < 20
    assert most_at_once([r for r in executions(log) if r.ended is not None]) == 1
    assert daemon.stop() == 0


def test_a_crashed_host_gives_its_room_back_within_its_leases(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    """SIGKILL of the whole daemon, parent and children, mid-task: no hand-back runs.
    Another daemon on the database starts the limited work once the dead claim's lease
    has passed and it recovered the task: the room is back within the lease."""
    groups = {
        "g": {"queues": ["email"], "processes": 1, "concurrency": 2, "prefetch": 0, "lease": "4s"}
    }
    config = fault_config(tmp_path, dialect, db_target, groups)
    config["limits"] = {"smtp": {"queues": ["email"], "concurrency": 1}}
    first = daemon_factory(config).start()
    ids, log, release = _gated(tmp_path, dialect, db_target, 1)
    wait_for("the task to start", lambda: len(executions(log)) == 1, timeout=60)
    # The parent first, so that it hands nothing back; its children at once after, as
    # they begin to drain (they run in process groups of their own).
    children = list(first.children())
    os.kill(first.pid, signal.SIGKILL)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    quick = tmp_path / "quick.log"
    (other,) = submit(dialect, db_target, "f.quick", [{"log": str(quick)}], queue="email")
    release.touch()
    (tmp_path / "two").mkdir()
    second_config = fault_config(tmp_path / "two", dialect, db_target, groups)
    second_config["limits"] = config["limits"]
    second = Daemon(tmp_path / "two", second_config).start()
    try:
        wait_for(
            "both tasks to succeed",
            lambda: all_terminal(dialect, db_target, [*ids, other]),
            timeout=60,
        )
        (ran,) = executions(quick)
        waited = ran.started - killed_at
        # Not before the dead claim's lease ran out (renewed every third of it, so it
        # ends 2.7 to 4 s after the kill), and not long after.
        assert 2.0 < waited < 4.0 + 15.0, waited
        finished = [r for r in executions(log) + executions(quick) if r.ended is not None]
        assert most_at_once(finished) == 1
    finally:
        assert second.stop() == 0


def test_two_groups_keep_one_rate(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    """`rate: 10/1s` over two groups (separate processes): no second holds more than 10
    claims, by the database's clock (docs/limits.md: a start counts when it is
    claimed), and the claims are spread at the rate rather than bunched. A claim's
    time is read from its lease, which SQLite's draw sets a moment after it counted
    the start: windows of 950 ms leave room for that moment on a loaded machine."""
    groups = {
        name: {"queues": ["api"], "processes": 1, "concurrency": 2, "prefetch": 0}
        for name in ("a", "b")
    }
    config = fault_config(tmp_path, dialect, db_target, groups)
    config["limits"] = {"partner": {"queues": ["api"], "rate": "10/1s"}}
    daemon = daemon_factory(config).start()
    claims = tmp_path / "claims.log"
    payload = {"claims": str(claims), "lease_ms": 30_000}  # the groups' default lease
    ids = submit(dialect, db_target, "f.claim_time", [payload] * 30, queue="api")
    wait_for("every task to succeed", lambda: all_terminal(dialect, db_target, ids), timeout=90)
    at = sorted(int(line) for line in claims.read_text().split())
    assert len(at) == 30
    most = max(sum(1 for t in at if s <= t < s + 950) for s in at)
    assert most <= 10, most
    # 30 claims at 10 per second: the last at least 2 s after the first.
    assert at[-1] - at[0] >= 2000, at[-1] - at[0]
    assert daemon.stop() == 0


def test_each_partition_has_its_budget_across_groups(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    """`concurrency: 1` per `payload.tenant`, kept by two groups: one task of a tenant
    at a time, two tenants at once."""
    groups = {
        name: {"queues": ["jobs"], "processes": 1, "concurrency": 3, "prefetch": 0}
        for name in ("a", "b")
    }
    config = fault_config(tmp_path, dialect, db_target, groups)
    config["limits"] = {
        "tenant": {"queues": ["jobs"], "concurrency": 1, "partition_by": "payload.tenant"}
    }
    daemon = daemon_factory(config).start()
    logs = {tenant: tmp_path / f"{tenant}.log" for tenant in ("acme", "globex")}
    payloads = [
        {"log": str(logs[tenant]), "seconds": 0.2, "tenant": tenant}
        for _ in range(6)
        for tenant in logs
    ]
    ids = submit(dialect, db_target, "f.quick", payloads, queue="jobs")
    wait_for("every task to succeed", lambda: all_terminal(dialect, db_target, ids), timeout=90)
    for log in logs.values():
        runs = executions(log)
        assert len(runs) == 6
        assert most_at_once(runs) == 1
    assert most_at_once([r for log in logs.values() for r in executions(log)]) == 2
    assert daemon.stop() == 0


@pytest.mark.timing
@pytest.mark.parametrize("dialect", ["postgres"], indirect=True)
def test_a_relayed_child_hears_at_once_that_room_came_back(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    """With `direct_dsn` the parent holds the host's LISTEN and the children none: a
    child held back by a limit hears through the parent that a task settled, instead
    of finding the room at its next look (every 250 ms, `ROOM_POLL_MS`). Group x runs
    a task of queue a, holding the one slot; group y's task of queue b waits for it."""
    groups = {
        name: {"queues": [queue], "processes": 1, "concurrency": 1, "prefetch": 0}
        for name, queue in (("x", "a"), ("y", "b"))
    }
    database = {**database_section(dialect, db_target), "direct_dsn": db_target}
    config = base_config(tmp_path, database, groups)
    config["handlers"] = ["tests.daemon.fault_handlers:registry"]
    config["limits"] = {"one": {"queues": ["a", "b"], "concurrency": 1}}
    daemon_factory(config).start()
    holding, waiting = tmp_path / "a.log", tmp_path / "b.log"
    gaps = []
    for n in range(1, 13):
        submit(dialect, db_target, "f.quick", [{"log": str(holding), "seconds": 0.15}], queue="a")
        wait_for("the task of queue a to start", lambda n=n: len(executions(holding)) == n)
        submit(dialect, db_target, "f.quick", [{"log": str(waiting)}], queue="b")
        wait_for(
            "the task of queue b to end",
            lambda n=n: sum(r.ended is not None for r in executions(waiting)) == n,
            timeout=20,
        )
        held = max(executions(holding), key=lambda r: r.started)
        then = max(executions(waiting), key=lambda r: r.started)
        assert held.ended is not None and then.started >= held.ended  # never both at once
        gaps.append(then.started - held.ended)
    # Polling, the wait after each release averages half the poll (125 ms); told, it is
    # the settlement's commit, the relay and the claim.
    mean = sum(gaps) / len(gaps)
    assert mean < 0.08, f"room came back to the waiting child {mean * 1000:.0f} ms late on average"


@pytest.mark.parametrize("dialect", ["postgres"], indirect=True)
def test_the_parent_listens_for_settlements_only_while_limits_are_configured(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    """Every task settles with a notification: the parent's relay hears them on a
    LISTEN of their own, opened by the reload that adds the first limit and closed by
    the one that removes the last."""
    groups = {"g": {"queues": ["email"], "processes": 1, "concurrency": 1}}
    database = {**database_section(dialect, db_target), "direct_dsn": db_target}
    config = base_config(tmp_path, database, groups)
    daemon = daemon_factory(config).start()

    def listens() -> list[str]:
        return [q.lower() for q in pg_listen_queries(db_target)]

    wait_for("the relay's LISTEN", lambda: any("cairnq_queued" in q for q in listens()))
    assert not any("cairnq_done" in q for q in listens())
    for limits, heard in (({"smtp": {"queues": ["email"], "concurrency": 1}}, True), ({}, False)):
        config["limits"] = limits
        daemon.write_config(config)
        done = daemon.cli("reload", "--wait", "30s")
        assert done.returncode == 0, done.stderr
        wait_for(
            f"the settlements' LISTEN {'opened' if heard else 'closed'}",
            lambda heard=heard: any("cairnq_done" in q for q in listens()) == heard,
        )
    assert any("cairnq_queued" in q for q in listens())
    assert daemon.stop() == 0
