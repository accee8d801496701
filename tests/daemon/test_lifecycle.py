"""Child lifecycle under the real daemon: recycling, orphans, crashloop, QUIT, 2nd SIGINT.

SQLite only: these exercise the supervisor's process handling, not the store.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.support.daemon import base_config, gone
from tests.support.harness import (
    client_call,
    database_section,
    gauge,
    scrape,
    stats,
    wait_running,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

SQLITE = "sqlite"


def config_for(tmp_path: Path, db: str, groups: dict[str, Any]) -> dict[str, Any]:
    return base_config(tmp_path, database_section(SQLITE, db), groups)


def get(db: str, task_id: str) -> Any:
    return client_call(SQLITE, db, lambda c: c.get(task_id))


def submit_block(db: str, release: Path, queue: str, **opts: Any) -> Any:
    async def submit(c: CairnQ) -> Any:
        return await c.submit("t.block", {"until": str(release)}, queue=queue, **opts)

    return client_call(SQLITE, db, submit)


def recycle(
    tmp_path: Path, db: str, daemon_factory: Any, reason: str, n: int, **limits: Any
) -> None:
    config = config_for(
        tmp_path,
        db,
        {"g": {"queues": ["q"], "processes": 2, "concurrency": 2, "lease": "30s", **limits}},
    )
    daemon = daemon_factory(config).start()
    first = set(daemon.children("g"))
    assert len(first) == 2

    async def submit(c: CairnQ) -> list[Any]:
        return await c.submit_many(
            [{"name": "t.sleep", "queue": "q", "payload": {"seconds": 0.01}} for _ in range(n)]
        )

    tasks = client_call(SQLITE, db, submit)
    wait_for(
        f"all {n} tasks to succeed",
        lambda: stats(SQLITE, db, "q")["q"]["succeeded"] == n,
        timeout=180,
    )
    counts = stats(SQLITE, db, "q")["q"]
    assert counts == {"queued": 0, "running": 0, "succeeded": n, "failed": 0, "canceled": 0}
    pids = {get(db, t.id).result["pid"] for t in tasks}
    assert len(pids) > 2, f"tasks ran on {pids} only: no child was recycled"
    assert pids - first, pids
    wait_for(
        "the pool to be refilled with fresh children",
        lambda: len(now := set(daemon.children("g"))) == 2 and now != first,
    )
    assert f"exited ({reason})" in daemon.output()
    port = daemon.metrics_port()

    def restarts() -> float | None:
        value = gauge(scrape(port), "cairnq_child_restarts_total", group="g", reason=reason)
        return value if value and value > 0 else None

    wait_for(f"cairnq_child_restarts_total{{reason={reason!r}}} > 0", restarts)
    assert daemon.stop() == 0


def test_max_tasks_per_child_recycles_children(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    recycle(tmp_path, sqlite_path, daemon_factory, "max_tasks", 100, max_tasks_per_child=20)


def test_max_memory_recycles_children(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    # 1MiB is the smallest the config accepts; every Python child is far above it, so
    # each one leaves after its first task(s).
    recycle(tmp_path, sqlite_path, daemon_factory, "max_memory", 12, max_memory="1MiB")


@pytest.mark.timing
def test_orphaned_child_finishes_its_task_and_exits(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(
        tmp_path,
        sqlite_path,
        {"g": {"queues": ["q"], "processes": 1, "concurrency": 1, "lease": "60s"}},
    )
    config["shutdown_timeout"] = "10s"
    daemon = daemon_factory(config).start()
    release = tmp_path / "release"
    task = submit_block(sqlite_path, release, "q")
    wait_running(SQLITE, sqlite_path, task.id)
    (child,) = daemon.children("g")
    assert daemon.proc is not None
    daemon.proc.kill()
    daemon.proc.wait(timeout=10)
    wait_for("the child to notice its parent died", lambda: "parent went away" in daemon.output())
    assert not gone(child), "the orphan left before finishing its task"
    released_at = time.monotonic()
    release.touch()
    done = client_call(SQLITE, sqlite_path, lambda c: c.wait(task.id, timeout_ms=30_000))
    assert done.status == "succeeded", done
    assert done.result["pid"] == child
    wait_for("the orphaned child to exit", lambda: gone(child), timeout=10 + 15)
    assert time.monotonic() - released_at < 10 + 15


def test_crashing_group_enters_crashloop_and_others_keep_serving(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(
        tmp_path,
        sqlite_path,
        {
            "bad": {
                "queues": ["bad"],
                "processes": 1,
                "handlers": ["tests.daemon.lifecycle_handlers:registry"],
            },
            "good": {"queues": ["good"], "processes": 1},
        },
    )
    config["supervisor"].update(restart_budget=3, restart_window="60s", backoff_max="200ms")
    daemon = daemon_factory(config).start()

    async def submit(c: CairnQ) -> Any:
        return await c.submit("l.crash", queue="bad", max_attempts=50)

    client_call(SQLITE, sqlite_path, submit)
    wait_for("the crash-looping log line", lambda: "crash-looping" in daemon.output(), 90)
    port = daemon.metrics_port()
    wait_for(
        "cairnq_group_state{state=crashloop} 1",
        lambda: gauge(scrape(port), "cairnq_group_state", group="bad", state="crashloop") == 1.0,
    )
    result = client_call(SQLITE, sqlite_path, lambda c: c.call("t.echo", {"ok": 1}, queue="good"))
    assert result == {"ok": 1}
    assert daemon.proc is not None and daemon.proc.poll() is None
    assert len(daemon.children("good")) == 1
    assert not daemon.children("bad")  # the dead slot stays empty while the window is full
    assert daemon.stop() == 0


def assert_handed_back(db: str, task_id: str) -> None:
    """The operator's stop cut the task short: it is queued with its attempt back."""
    task = get(db, task_id)
    assert (task.status, task.attempt, task.worker_id) == ("queued", 0, None), task


@pytest.mark.timing
def test_sigquit_stops_at_once_and_hands_back_the_running_task(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(
        tmp_path,
        sqlite_path,
        {"g": {"queues": ["q"], "processes": 1, "concurrency": 1, "lease": "60s"}},
    )
    config["shutdown_timeout"] = "60s"
    daemon = daemon_factory(config).start()
    task = submit_block(sqlite_path, tmp_path / "never", "q")
    wait_running(SQLITE, sqlite_path, task.id)
    started = time.monotonic()
    daemon.signal(signal.SIGQUIT)
    assert daemon.proc is not None
    code = daemon.proc.wait(timeout=30)
    elapsed = time.monotonic() - started
    assert code == 0, daemon.output()
    assert elapsed < 10, f"SIGQUIT took {elapsed:.1f}s"
    assert_handed_back(sqlite_path, task.id)


@pytest.mark.timing
def test_second_sigint_stops_a_stuck_drain(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(
        tmp_path,
        sqlite_path,
        {"g": {"queues": ["q"], "processes": 1, "concurrency": 1, "lease": "60s"}},
    )
    config["shutdown_timeout"] = "60s"
    daemon = daemon_factory(config).start()
    task = submit_block(sqlite_path, tmp_path / "never", "q")
    wait_running(SQLITE, sqlite_path, task.id)
    (child,) = daemon.children("g")
    mark = len(daemon.messages)
    daemon.signal(signal.SIGINT)
    daemon.wait_notify("STOPPING=1", start=mark)
    wait_for("the child to drain", lambda: "draining" in daemon.children("g").get(child, ""))
    assert daemon.proc is not None and daemon.proc.poll() is None
    assert get(sqlite_path, task.id).status == "running"
    started = time.monotonic()
    daemon.signal(signal.SIGINT)
    code = daemon.proc.wait(timeout=30)
    elapsed = time.monotonic() - started
    assert code == 0, daemon.output()
    assert elapsed < 10, f"second SIGINT took {elapsed:.1f}s"
    assert "second SIGINT" in daemon.output()
    assert gone(child)
    assert_handed_back(sqlite_path, task.id)


def test_the_parent_survives_any_line_a_child_writes(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(tmp_path, sqlite_path, {"g": {"queues": ["q"], "processes": 1}})
    daemon = daemon_factory(config).start()
    (child,) = daemon.children("g")
    garbage = [
        '{"t":"hb","rss":"x"}',  # well-formed JSON, a field of the wrong type
        '{"t":"hb","busy":0,"rss":1e400,"state":"run"}',
        '{"t":"hb","busy":0,"rss":123456789012345678901234567890,"state":"run"}',
        '{"t":"ready","v":1,"pid":1,"worker_id":["x"],"gen":1,"rss":1}',
        '{"t":"start","id":7}',
        '{"t":"end","id":null,"queue":"q"}',
        '{"t":"bye"}',
        '{"t":"fatal","error":{"no":"text"}}',
        '{"t":"dberr","kind":3}',
        '{"t":"who-knows"}',
        '{"no":"kind"}',
        "[1, 2, 3]",
        "not json at all",
        '"\\ud800"',
    ]

    async def scribble(c: CairnQ) -> Any:
        return await c.call("t.scribble", {"lines": garbage}, queue="q", timeout_ms=30_000)

    assert client_call(SQLITE, sqlite_path, scribble)["pid"] == child
    wait_for("the malformed-message log line", lambda: "malformed message" in daemon.output())
    result = client_call(SQLITE, sqlite_path, lambda c: c.call("t.echo", 5, queue="q"))
    assert result == 5
    assert daemon.proc is not None and daemon.proc.poll() is None, daemon.output()
    assert set(daemon.children("g")) == {child}, "the child was replaced"
    assert "Traceback" not in daemon.output()
    assert daemon.stop() == 0


def test_sigttin_dumps_every_child_s_stacks_and_stops_nobody(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(tmp_path, sqlite_path, {"g": {"queues": ["q"], "processes": 2}})
    # Long enough that a stopped child would still be stopped when the test looks.
    config["supervisor"]["heartbeat_timeout"] = "120s"
    daemon = daemon_factory(config).start()
    children = set(daemon.children("g"))
    daemon.signal(signal.SIGTTIN)
    wait_for(
        "a child's stack dump",
        lambda: daemon.output().count("cairnqd/daemon/child/main.py") >= 2,
        timeout=15,
    )
    for pid in children:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert state != "T", f"child {pid} is stopped"

    async def calls(c: CairnQ) -> list[Any]:
        return [await c.call("t.sleep", {"seconds": 0.01}, queue="q", timeout_ms=15_000)
                for _ in range(6)]  # fmt: skip

    ran_on = {result["pid"] for result in client_call(SQLITE, sqlite_path, calls)}
    assert ran_on <= children and ran_on, ran_on
    assert set(daemon.children("g")) == children
    assert daemon.stop() == 0
