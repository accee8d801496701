"""The real daemon, real children, real signals, on SQLite and Postgres."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.support.daemon import base_config
from tests.support.harness import client_call, database_section, gauge, scrape, stats
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def two_groups(tmp_path: Path, dialect: str, target: str, **extra: Any) -> dict[str, Any]:
    return base_config(
        tmp_path,
        database_section(dialect, target),
        {
            "fast": {"queues": ["fast"], "processes": 2, "concurrency": 4, "lease": "5s", **extra},
            "slow": {"queues": ["slow"], "processes": 1, "concurrency": 2, "lease": "5s"},
        },
    )


def test_two_groups_titles_and_metrics_match_stats(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    daemon = daemon_factory(two_groups(tmp_path, dialect, db_target)).start()
    titles = daemon.children()
    assert len(daemon.children("fast")) == 2, titles
    assert len(daemon.children("slow")) == 1, titles
    assert all(re.match(r"cairnqd: worker \[(fast|slow)\] \d/\d", t) for t in titles.values())
    assert daemon.title().startswith("cairnqd: master")

    async def submit(c: CairnQ) -> None:
        await c.submit_many([{"name": "t.echo", "queue": "fast", "payload": i} for i in range(50)])
        await c.submit_many([{"name": "t.echo", "queue": "slow"} for _ in range(5)])
        await c.submit("t.unhandled", queue="nobody")

    client_call(dialect, db_target, submit)
    wait_for(
        "all handled tasks to succeed",
        lambda: (
            stats(dialect, db_target).get("fast", {}).get("succeeded") == 50
            and stats(dialect, db_target)["slow"]["succeeded"] == 5
        ),
    )
    port = daemon.metrics_port()
    expected = stats(dialect, db_target)

    def metrics_match() -> bool:
        text = scrape(port)
        for queue, counts in expected.items():
            for status, n in counts.items():
                if gauge(text, "cairnq_tasks", queue=queue, status=status) != float(n):
                    return False
        return True

    wait_for("/metrics to equal stats()", metrics_match, timeout=30)
    # Children send their counts a few times a second, not per task.
    wait_for(
        "the succeeded counter to reach 50",
        lambda: gauge(scrape(port), "cairnq_tasks_succeeded_total", queue="fast") == 50.0,
        timeout=10,
    )
    assert daemon.stop() == 0


@pytest.mark.timing
def test_sigkill_child_mid_task_requeues_at_once(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    config = base_config(
        tmp_path,
        database_section(dialect, db_target),
        # A long lease: redelivery must come from the hand-back, not from expiry.
        {"g": {"queues": ["q"], "processes": 2, "concurrency": 1, "lease": "60s"}},
    )
    daemon = daemon_factory(config).start()
    release = tmp_path / "release"

    async def submit(c: CairnQ) -> Any:
        return await c.submit("t.block", {"until": str(release)}, queue="q")

    task = client_call(dialect, db_target, submit)

    def running_on() -> str | None:
        got = client_call(dialect, db_target, lambda c: c.get(task.id))
        return got.worker_id if got.status == "running" else None

    worker_id = wait_for("the task to start", running_on)
    victims = [pid for pid, title in daemon.children("g").items()]
    # Find the child running it: its worker_id names group and slot.
    slot = int(worker_id.split(":")[1].split(".")[1])
    victim = next(p for p, t in daemon.children("g").items() if f"] {slot + 1}/2" in t)
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)

    def requeued_or_rerun() -> bool:
        got = client_call(dialect, db_target, lambda c: c.get(task.id))
        return got.attempt == 2 or got.status == "queued"

    wait_for("the hand-back", requeued_or_rerun, timeout=10)
    assert time.monotonic() - killed_at < 5.0  # well before the 60 s lease
    release.touch()
    done = client_call(dialect, db_target, lambda c: c.wait(task.id, timeout_ms=30_000))
    assert done.status == "succeeded" and done.attempt == 2
    assert done.result["pid"] != victim
    wait_for("the slot to be refilled", lambda: len(daemon.children("g")) == 2)
    assert victim not in daemon.children("g")
    assert len(victims) == 2
    assert daemon.stop() == 0


def test_nothing_lost_with_a_child_killed_every_second(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    config = base_config(
        tmp_path,
        database_section(dialect, db_target),
        {"g": {"queues": ["q"], "processes": 3, "concurrency": 4, "lease": "30s"}},
    )
    daemon = daemon_factory(config).start()
    # The load lasts at least n * seconds / 12 slots = 6 s however fast the machine
    # (2,000 tasks of 10 ms ended after two kills on a fast one), so it meets a kill a
    # second several times over.
    n, seconds = 1200, 0.06

    async def submit(c: CairnQ) -> None:
        await c.submit_many(
            [{"name": "t.sleep", "queue": "q", "payload": {"seconds": seconds}, "max_attempts": 50}
             for _ in range(n)]
        )  # fmt: skip

    client_call(dialect, db_target, submit)
    kills = 0
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        counts = stats(dialect, db_target, "q")["q"]
        if counts["succeeded"] == n:
            break
        children = list(daemon.children("g"))
        if children and counts["succeeded"] < n - 50:
            os.kill(children[kills % len(children)], signal.SIGKILL)
            kills += 1
        time.sleep(1.0)
    counts = stats(dialect, db_target, "q")["q"]
    assert counts == {"queued": 0, "running": 0, "succeeded": n, "failed": 0, "canceled": 0}
    assert kills >= 3, "the load finished before the test could kill anything"
    assert daemon.stop() == 0


def test_broken_handler_module_makes_only_its_group_fatal(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    # A module broken at start is refused before any child (tests/cli/test_preflight.py);
    # here it breaks while the daemon runs, and its children die and cannot come back.
    config = two_groups(tmp_path, dialect, db_target)
    config["groups"]["slow"]["handlers"] = ["tests.daemon.flaky_handlers:registry"]
    daemon = daemon_factory(config).start()
    doomed = wait_for("the slow group's children", lambda: daemon.children("slow"))
    (tmp_path / "handlers-broken").touch()
    for pid in doomed:
        os.kill(pid, signal.SIGKILL)

    def fatal_logged() -> bool:
        return "FATAL" in daemon.output() and "handlers-broken exists" in daemon.output()

    wait_for("the FATAL log line", fatal_logged)
    assert not daemon.children("slow")
    text = scrape(daemon.metrics_port())
    assert gauge(text, "cairnq_group_state", group="slow", state="fatal") == 1.0
    result = client_call(dialect, db_target, lambda c: c.call("t.echo", {"ok": 1}, queue="fast"))
    assert result == {"ok": 1}
    assert daemon.proc is not None and daemon.proc.poll() is None
    assert daemon.stop() == 0


def test_hup_rolls_only_the_changed_group(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    config = two_groups(tmp_path, dialect, db_target)
    daemon = daemon_factory(config).start()
    fast_before, slow_before = set(daemon.children("fast")), set(daemon.children("slow"))

    async def submit(c: CairnQ) -> list[Any]:
        return await c.submit_many(
            [{"name": "t.sleep", "queue": "slow", "payload": {"seconds": 0.05}} for _ in range(100)]
        )

    client_call(dialect, db_target, submit)
    config["groups"]["slow"]["concurrency"] = 3
    daemon.write_config(config)
    mark = len(daemon.messages)
    daemon.signal(signal.SIGHUP)
    daemon.wait_notify("RELOADING=1", start=mark)
    wait_for(
        "the slow group to roll",
        lambda: set(daemon.children("slow")) and not set(daemon.children("slow")) & slow_before,
        timeout=60,
    )
    assert set(daemon.children("fast")) == fast_before
    wait_for(
        "every task to succeed",
        lambda: stats(dialect, db_target, "slow")["slow"]["succeeded"] == 100,
        timeout=60,
    )
    assert stats(dialect, db_target, "slow")["slow"]["failed"] == 0
    assert daemon.stop() == 0


def test_hup_with_invalid_file_keeps_old_config(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    config = two_groups(tmp_path, dialect, db_target)
    daemon = daemon_factory(config).start()
    before = set(daemon.children())
    text = daemon.config_path.read_text().replace("processes: 2", "processes: two")
    daemon.config_path.write_text(text)
    daemon.signal(signal.SIGHUP)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "processes: two" in t)
    wait_for("the reload error", lambda: f"cairnq.yaml:{line}:" in daemon.output())
    daemon.wait_notify("STATUS=reload failed:")
    port = daemon.metrics_port()
    wait_for(
        "the failed-reload metric",
        lambda: gauge(scrape(port), "cairnq_config_last_reload_successful") == 0.0,
    )
    assert set(daemon.children()) == before
    result = client_call(dialect, db_target, lambda c: c.call("t.echo", 7, queue="fast"))
    assert result == 7
    assert daemon.stop() == 0


@pytest.mark.timing
def test_term_during_load_drains_and_exits_zero(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    config = two_groups(tmp_path, dialect, db_target)
    daemon = daemon_factory(config).start()

    async def submit(c: CairnQ) -> None:
        await c.submit_many(
            [{"name": "t.sleep", "queue": "fast", "payload": {"seconds": 0.2}} for _ in range(200)]
        )

    client_call(dialect, db_target, submit)
    wait_for("work in flight", lambda: stats(dialect, db_target, "fast")["fast"]["running"] > 0)
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc is not None
    code = daemon.proc.wait(timeout=10 + 20)
    assert code == 0, daemon.output()
    assert time.monotonic() - started < 10 + 20
    counts = stats(dialect, db_target, "fast")["fast"]
    assert counts["running"] == 0
    assert counts["queued"] + counts["succeeded"] == 200
    assert "STOPPING=1" in daemon.messages or (
        daemon.poll_notify() or "STOPPING=1" in daemon.messages
    )


def test_connection_budget_over_the_server_limit_refuses_to_start(
    tmp_path: Path, pg_dsn: str
) -> None:
    import subprocess
    import sys

    import yaml

    from tests.support.daemon import REPO

    config = base_config(
        tmp_path,
        {"dsn": pg_dsn, "auto_migrate": True, "expected_hosts": 100_000},
        {"g": {"queues": ["q"], "processes": 2}},
    )
    (tmp_path / "run").mkdir(exist_ok=True)
    path = tmp_path / "cairnq.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "cairnqd.cli", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 78, done.stderr
    assert "Postgres connections" in done.stderr and "max_connections" in done.stderr


def test_roll_with_max_surge_two_replaces_every_child(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    config = base_config(
        tmp_path,
        database_section(dialect, db_target),
        {"g": {"queues": ["q"], "processes": 4, "concurrency": 2}},
    )
    config["reload"] = {"max_surge": 2}
    daemon = daemon_factory(config).start()
    before = set(daemon.children("g"))
    assert len(before) == 4
    config["groups"]["g"]["lease"] = "45s"
    daemon.write_config(config)
    daemon.signal(signal.SIGHUP)

    def rolled() -> bool:
        now = set(daemon.children("g"))
        # Capacity never drops below the pool size while it rolls.
        assert len(now) >= 4, now
        return len(now) == 4 and not now & before

    wait_for("every child to be replaced", rolled, timeout=90)
    assert daemon.stop() == 0
