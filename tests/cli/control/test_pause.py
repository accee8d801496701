"""Queue pauses: the store's table, the opt-in worker, and `cairnqd pause/resume`
against a real daemon on both dialects."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from cairnqd.worker import Worker
from tests.support.cli import cli
from tests.support.daemon import write_config
from tests.support.databases import make_store
from tests.support.harness import client_call, control_config, gauge, scrape
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


async def test_pauses_are_rows_of_our_own_table(dialect: str, db_target: str) -> None:
    store = make_store(dialect, db_target)
    async with store:
        made = await store.pauses.pause(["a", "b", "a"], paused_by="ops@h", reason="deploy")
        assert [p.queue for p in made] == ["a", "b"]
        again = await store.pauses.pause(["a"], paused_by="other@h")
        assert again == []  # the first pause stays, with its author
        paused = await store.pauses.all()
        assert [(p.queue, p.paused_by, p.reason) for p in paused] == [
            ("a", "ops@h", "deploy"),
            ("b", "ops@h", "deploy"),
        ]
        assert abs(paused[0].paused_at_ms - time.time() * 1000) < 60_000
        ended = await store.pauses.resume(["b", "c"])
        assert [p.queue for p in ended] == ["b"]
        assert [p.queue for p in await store.pauses.all()] == ["a"]
        with pytest.raises(ValueError, match="queues"):
            await store.pauses.pause([""], paused_by="ops@h")
        with pytest.raises(ValueError, match="reason"):
            await store.pauses.pause(["a"], paused_by="ops@h", reason="x" * 1001)


async def _run_worker(store: Any, honour: bool, seconds: float) -> list[str]:
    """Queue one task on paused `a` and one on `b`; what a worker runs in `seconds`."""
    ran: list[str] = []
    client = CairnQ(store)
    await client.submit("t", {"q": "a"}, queue="a")
    await client.submit("t", {"q": "b"}, queue="b")
    worker = Worker(store, ["a", "b"], poll_interval_ms=50, honour_pauses=honour)

    @worker.task("t")
    async def handler(ctx: Any, payload: Any) -> None:
        ran.append(payload["q"])

    async with worker.background():
        await asyncio.sleep(seconds)
    return sorted(ran)


async def test_only_a_worker_that_opts_in_honours_pauses(dialect: str, db_target: str) -> None:
    store = make_store(dialect, db_target)
    async with store:
        await store.pauses.pause(["a"], paused_by="ops@h")
        # The public SDK's behaviour by default: a pause is cairnqd's own business.
        assert await _run_worker(store, False, 1.5) == ["a", "b"]
        assert await _run_worker(store, True, 1.5) == ["b"]
        stats = await store.stats()
        assert stats["a"]["queued"] == 1


def _submit(dialect: str, target: str, queue: str, n: int) -> list[str]:
    async def go(c: CairnQ) -> list[str]:
        return [(await c.submit("t.echo", {"i": i}, queue=queue)).id for i in range(n)]

    return client_call(dialect, target, go)  # type: ignore[no-any-return]


def _statuses(dialect: str, target: str, ids: list[str]) -> set[str]:
    async def go(c: CairnQ) -> set[str]:
        return {(await c.get(i)).status for i in ids}  # type: ignore[union-attr]

    return client_call(dialect, target, go)  # type: ignore[no-any-return]


def _children_paused(daemon: Any) -> list[list[str]]:
    done = daemon.cli("status", "--json")
    assert done.returncode == 0, done.stderr
    snap = json.loads(done.stdout)
    assert [p["queue"] for p in snap["paused_queues"]] == ["a"]
    return [c["paused"] for g in snap["groups"] for c in g["children"]]


@pytest.mark.timing
def test_pause_and_resume_reach_every_child_within_a_second(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any, groups: dict[str, Any]
) -> None:
    daemon = daemon_factory(control_config(tmp_path, dialect, db_target, groups)).start()
    paused = daemon.cli("pause", "--queue", "a", "--reason", "deploy in progress")
    assert paused.returncode == 0, paused.stderr
    assert "paused a (paused " in paused.stdout and "deploy in progress" in paused.stdout
    again = daemon.cli("pause", "--queue", "a")
    assert again.returncode == 1 and "already paused: a" in again.stdout  # no state change
    # Every child reports it skips `a` (its heartbeats carry what it found paused).
    wait_for("every child to see the pause", lambda: _children_paused(daemon) == [["a"], ["a"]])
    held_back = _submit(dialect, db_target, "a", 5)
    flowing = _submit(dialect, db_target, "b", 5)
    wait_for("queue b to drain", lambda: _statuses(dialect, db_target, flowing) == {"succeeded"})
    time.sleep(1.0)  # give a paused queue the chance to be (wrongly) claimed
    assert _statuses(dialect, db_target, held_back) == {"queued"}
    port = daemon.metrics_port()
    assert gauge(scrape(port), "cairnq_queue_paused", queue="a") == 1.0
    assert gauge(scrape(port), "cairnq_queue_paused", queue="b") == 0.0

    resumed = daemon.cli("resume", "--queue", "a")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed a" in resumed.stdout
    started = time.monotonic()
    wait_for("queue a to drain", lambda: _statuses(dialect, db_target, held_back) == {"succeeded"})
    assert time.monotonic() - started < 10  # a second to notice, plus the claim and run
    assert gauge(scrape(port), "cairnq_queue_paused", queue="a") == 0.0
    missing = daemon.cli("resume", "--queue", "a")
    assert missing.returncode == 1 and "not paused: a" in missing.stderr
    assert daemon.stop() == 0


def test_pause_needs_a_queue(tmp_path: Path, sqlite_path: str) -> None:
    # No daemon: the commands need only the database.
    path = write_config(
        tmp_path, control_config(tmp_path, "sqlite", sqlite_path, {"g": {"queues": ["a"]}})
    )
    refused = cli(path, "pause")
    assert refused.returncode == 64
    assert "--queue" in refused.stderr
    long_reason = cli(path, "pause", "--queue", "a", "--reason", "x" * 1001)
    assert long_reason.returncode == 64 and "--reason" in long_reason.stderr


def test_a_heartbeat_names_paused_queues_within_a_budget() -> None:
    from cairnqd.daemon.child.main import _within

    names = [f"q{i:03d}" + "x" * 250 for i in range(20)]
    kept = _within(names, 1024)
    assert kept == tuple(names[:3])  # 3 x 257 fits in 1024, a fourth does not
    assert _within(["a", "b"], 1024) == ("a", "b")


async def test_a_busy_worker_stops_claiming_a_paused_queue_within_a_second(
    dialect: str, db_target: str
) -> None:
    store = make_store(dialect, db_target)
    started: list[float] = []
    async with store:
        client = CairnQ(store)
        worker = Worker(store, ["a"], poll_interval_ms=50, concurrency=4, honour_pauses=True)

        @worker.task("t")
        async def handler(ctx: Any, payload: Any) -> None:
            started.append(time.monotonic())

        async with worker.background():
            paused_at = None
            for i in range(60):  # a task every 50 ms for 3 s; the pause lands at 1 s
                await client.submit("t", {"i": i}, queue="a")
                if i == 20:
                    paused_at = time.monotonic()
                    await store.pauses.pause(["a"], paused_by="ops@h")
                await asyncio.sleep(0.05)
        assert paused_at is not None
        before = [t for t in started if t < paused_at]
        after = [t - paused_at for t in started if t >= paused_at]
        assert len(before) >= 10  # it was claiming all along until the pause
        assert all(delay < 1.0 for delay in after), after
        assert (await store.stats())["a"]["queued"] >= 30  # the rest waits
