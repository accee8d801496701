"""The daemon through a real PgBouncer, in transaction and session pool mode.

Its children and the parent's threads share the pooler's server connections: nothing
may be prepared, no startup `options` sent, and nothing may rely on a session's state.
Before `database.pooler`, children logged `prepared statement "_pg3_0" already exists`
and stayed stuck; here thousands of tasks drain with no error or warning logged beyond
the one line saying push is off, and a killed child's task is handed back at once.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cairnqd import CairnQ
from tests.pooler.conftest import Pooled
from tests.support.daemon import base_config
from tests.support.harness import gauge, scrape
from tests.support.waiting import wait_for

SHORT = 2000
LONG = 20


def pooled_database(pooled: Pooled, **extra: Any) -> dict[str, Any]:
    return {"dsn": pooled.pooled, "pooler": pooled.mode, "auto_migrate": True, **extra}


def problems_logged(output: str, *expected: str) -> list[str]:
    """Log lines at WARNING and above, and tracebacks, except the push line and lines
    holding one of `expected`."""
    found = []
    for line in output.splitlines():
        if any(e in line for e in ("push wake-ups off", *expected)):
            continue
        if re.search(r" (WARNING|ERROR|CRITICAL) ", line) or line.startswith("Traceback"):
            found.append(line)
    return found


def test_thousands_of_tasks_drain_through_the_pooler(
    tmp_path: Path, pooled: Pooled, daemon_factory: Any
) -> None:
    config = base_config(
        tmp_path,
        pooled_database(pooled, connections_per_child=2),
        {
            "fast": {"queues": ["fast"], "processes": 2, "concurrency": 16},
            "slow": {"queues": ["slow"], "processes": 2, "concurrency": 10},
        },
    )
    config["groups"]["fast"]["poll_interval"] = "100ms"
    config["groups"]["slow"]["poll_interval"] = "100ms"
    daemon = daemon_factory(config).start()

    async def submit(c: CairnQ) -> None:
        for start in range(0, SHORT, 500):
            await c.submit_many(
                [{"name": "t.echo", "payload": {"n": n}, "queue": "fast"}
                 for n in range(start, start + 500)]
            )  # fmt: skip
        for n in range(LONG):
            await c.submit("t.sleep", {"seconds": 2}, queue="slow", key=f"slow-{n}")

    client = lambda: CairnQ.postgres(pooled.pooled, pooler=pooled.mode, max_size=2)  # noqa: E731
    client_call_pooled(client, submit)

    def succeeded() -> int:
        async def count(c: CairnQ) -> int:
            stats = await c.stats()
            return sum(stats.get(q, {}).get("succeeded", 0) for q in ("fast", "slow"))

        return int(client_call_pooled(client, count))

    wait_for(f"{SHORT + LONG} tasks to succeed", lambda: succeeded() == SHORT + LONG, 180)
    port = daemon.metrics_port()
    text = scrape(port)
    assert gauge(text, "cairnq_db_up") == 1.0
    assert gauge(text, "cairnq_tasks", queue="fast", status="succeeded") == SHORT
    errors = [
        line
        for line in text.splitlines()
        if line.startswith("cairnq_db_errors_total{") and not line.endswith(" 0.0")
    ]
    assert errors == []
    assert daemon.stop() == 0
    assert problems_logged(daemon.output()) == []
    said = daemon.output().count("push wake-ups off")
    assert said == (1 if pooled.mode == "transaction" else 0)


@pytest.mark.timing
def test_sigkill_child_hands_back_through_the_pooler(
    tmp_path: Path, pooled_tx: Pooled, daemon_factory: Any
) -> None:
    pooled = pooled_tx
    config = base_config(
        tmp_path,
        pooled_database(pooled),
        # A long lease: redelivery must come from the hand-back, not from expiry.
        {"g": {"queues": ["q"], "processes": 2, "concurrency": 1, "lease": "60s"}},
    )
    config["groups"]["g"]["poll_interval"] = "100ms"
    daemon = daemon_factory(config).start()
    release = tmp_path / "release"
    client = lambda: CairnQ.postgres(pooled.pooled, pooler="transaction", max_size=1)  # noqa: E731

    async def submit(c: CairnQ) -> Any:
        return await c.submit("t.block", {"until": str(release)}, queue="q")

    task = client_call_pooled(client, submit)

    def running_on() -> str | None:
        got = client_call_pooled(client, lambda c: c.get(task.id))
        return got.worker_id if got.status == "running" else None

    worker_id = wait_for("the task to start", running_on)
    slot = int(worker_id.split(":")[1].split(".")[1])
    victim = next(p for p, t in daemon.children("g").items() if f"] {slot + 1}/2" in t)
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)

    def handed_back() -> bool:
        got = client_call_pooled(client, lambda c: c.get(task.id))
        return bool(got.attempt == 2 or got.status == "queued")

    wait_for("the hand-back", handed_back, timeout=20)
    # The CLI through the pooler too (it used to exit 70 half the time).
    for n in range(4):
        done_cli = daemon.cli("submit", "t.echo", "--queue", "q", "--payload", f'{{"n": {n}}}',
                              "--wait", "--timeout", "30s")  # fmt: skip
        assert done_cli.returncode == 0, done_cli.stderr
        assert f'"n": {n}' in done_cli.stdout
    assert time.monotonic() - killed_at < 10.0  # well before the 60 s lease
    release.touch()
    done = client_call_pooled(client, lambda c: c.wait(task.id, timeout_ms=30_000))
    assert done.status == "succeeded"
    assert done.result["pid"] != victim
    assert "handed back 1 task(s)" in daemon.output()
    assert daemon.stop() == 0
    assert problems_logged(daemon.output(), "SIGKILL") == []


def client_call_pooled(make: Any, action: Any) -> Any:
    """`client_call` on a client made by `make` (through the pooler)."""

    async def go() -> Any:
        client = make()
        await client.connect()
        try:
            return await action(client)
        finally:
            await client.close()

    return asyncio.run(go())


def test_two_daemons_one_purges_and_one_exports_the_gauges(
    tmp_path: Path, pooled_tx: Pooled, daemon_factory: Any
) -> None:
    # Behind a transaction pooler without direct_dsn both daemons used to win the
    # session locks: both purged and both exported the queue gauges.
    pooled = pooled_tx
    config = base_config(
        tmp_path,
        pooled_database(pooled),
        {"g": {"queues": ["q"], "processes": 1, "concurrency": 4}},
    )
    config["groups"]["g"]["poll_interval"] = "100ms"
    config["metrics"] = {"listen": "127.0.0.1:0", "queue_stats": "leader", "stats_ttl": "0s"}
    config["retention"] = {
        "interval": "1s",
        "rules": [{"status": "succeeded", "older_than": "1s"}],
    }
    daemons = [daemon_factory(config).start(), daemon_factory(config).start()]
    ports = [d.metrics_port() for d in daemons]
    client = lambda: CairnQ.postgres(pooled.pooled, pooler="transaction", max_size=1)  # noqa: E731

    async def submit(c: CairnQ) -> None:
        await c.submit_many([{"name": "t.echo", "queue": "q"} for _ in range(20)])

    def runs() -> list[float]:
        return [gauge(scrape(p), "cairnq_purge_runs_total") or 0.0 for p in ports]

    def exporting() -> list[bool]:
        return [gauge(scrape(p), "cairnq_tasks", queue="q", status="queued") is not None
                for p in ports]  # fmt: skip

    def one_purged_every_batch() -> list[float]:
        client_call_pooled(client, submit)
        return runs()

    # Several sweeps' worth of rounds: one daemon keeps the turn, the other never sweeps.
    seen = wait_for("four sweeps", one_purged_every_batch, 60, accept=lambda r: sum(r) >= 4)
    assert sorted(seen)[0] == 0.0, f"both daemons swept: {seen}"
    for _ in range(5):
        assert sorted(exporting()) == [False, True]
    # Rows old enough for the rule get deleted by the one daemon that sweeps.
    purged = wait_for(
        "a sweep that deletes rows",
        lambda: [d.output().count("purge sweep deleted") for d in daemons],
        60,
        accept=lambda counts: sum(counts) >= 1,
    )
    assert sorted(purged)[0] == 0, purged
    assert sorted(runs())[0] == 0.0
    for daemon in daemons:
        assert daemon.stop() == 0
        assert problems_logged(daemon.output()) == []


def wake_latencies_ms(pooled: Pooled, n: int) -> list[float]:
    """Submit `n` tasks one at a time to idle children; how long each took from just
    before its submit to its handler's start."""
    client = lambda: CairnQ.postgres(pooled.pooled, pooler=pooled.mode, max_size=1)  # noqa: E731

    async def measure(c: CairnQ) -> list[float]:
        out = []
        for _ in range(n):
            began = time.time()
            task = await c.submit("p.stamp", queue="lat")
            done = await c.wait(task.id, timeout_ms=30_000, poll_ms=20, max_poll_ms=50)
            out.append((float(done.result) - began) * 1000)
            await asyncio.sleep(0.05)  # let every child go back to waiting
        return out

    return list(client_call_pooled(client, measure))


def latency_config(tmp_path: Path, pooled: Pooled, **database: Any) -> dict[str, Any]:
    config = base_config(
        tmp_path,
        pooled_database(pooled, **database),
        {"lat": {"queues": ["lat"], "processes": 2, "concurrency": 2}},
    )
    config["handlers"] = ["tests.pooler.handlers:registry"]
    # Polling alone would take up to 5 s: a fast start can only come from a push.
    config["groups"]["lat"]["poll_interval"] = "5s"
    return config


@pytest.mark.timing
def test_push_wakeups_through_the_parent_with_direct_dsn(
    tmp_path: Path, pooled: Pooled, daemon_factory: Any
) -> None:
    daemon = daemon_factory(latency_config(tmp_path, pooled, direct_dsn=pooled.direct)).start()
    wait_for(
        "the start-up line on how wake-ups travel",
        lambda: "push wake-ups through this process" in daemon.output(),
    )
    # The first submits may land before the parent's LISTEN is proven; warm up.
    wake_latencies_ms(pooled, 3)
    latencies = sorted(wake_latencies_ms(pooled, 25))
    p50 = latencies[len(latencies) // 2]
    print(f"wake-up through the parent ({pooled.mode} pooler): p50 {p50:.1f} ms")  # -s shows it
    # Push against a 5 s poll: the bound tells the two apart with room for a loaded
    # machine (a quiet one measures 11-15 ms; CI under load has seen 22 ms). The 20 ms
    # figure itself is a benchmark's to show, not a timed test's.
    assert p50 <= 250.0, f"wake-up p50 {p50:.1f} ms: {[round(x, 1) for x in latencies]}"
    # The children LISTEN on nothing: the host's one LISTEN is the parent's.
    with psycopg.connect(pooled.direct) as conn:
        listening = conn.execute(
            "select count(*) from pg_stat_activity where datname = current_database() "
            "and query ilike 'listen %'"
        ).fetchone()
    assert listening == (1,)
    assert gauge(scrape(daemon.metrics_port()), "cairnq_listen_deaf") == 0.0
    assert daemon.stop() == 0
    assert problems_logged(daemon.output()) == []


def test_without_direct_dsn_the_children_poll_and_say_so(
    tmp_path: Path, pooled_tx: Pooled, daemon_factory: Any
) -> None:
    config = latency_config(tmp_path, pooled_tx)
    config["groups"]["lat"]["poll_interval"] = "500ms"
    daemon = daemon_factory(config).start()
    (line,) = [x for x in daemon.output().splitlines() if "push wake-ups" in x]
    assert "WARNING" in line and "database.direct_dsn is not set" in line
    latencies = sorted(wake_latencies_ms(pooled_tx, 6))
    assert latencies[len(latencies) // 2] > 20.0  # polled, not pushed
    assert daemon.stop() == 0


def test_two_daemons_one_schedules_and_hands_over_on_stop(
    tmp_path: Path, pooled_tx: Pooled, daemon_factory: Any
) -> None:
    # The scheduler's leadership behind a transaction pooler: a lease row, not a
    # session lock that both hosts would win.
    pooled = pooled_tx
    config = base_config(
        tmp_path, pooled_database(pooled), {"g": {"queues": ["default"], "processes": 1}}
    )
    config["schedules"] = {"tick": {"name": "t.echo", "every": "1s", "misfire": "skip"}}
    first = daemon_factory(config).start()
    wait_for("the first daemon to lead", lambda: "now runs the schedules" in first.output(), 30)
    second = daemon_factory(config).start()

    def per_slot() -> Counter[str]:
        # Read directly: the test's own polling stays off the daemons' pooler.
        with psycopg.connect(pooled.direct) as conn:
            rows = conn.execute(
                "select metadata->>'slot' from cairnq_tasks where name = 't.echo' "
                "and metadata ? 'slot'"
            ).fetchall()
        return Counter(str(r[0]) for r in rows)

    wait_for("six slots", lambda: len(per_slot()) >= 6, 30)
    assert "now runs the schedules" not in second.output()
    assert first.stop() == 0  # a clean stop gives the lease up at once
    wait_for("the second daemon to lead", lambda: "now runs the schedules" in second.output(), 10)
    before = len(per_slot())
    slots = wait_for(
        "three more slots",
        per_slot,
        30,
        accept=lambda found: len(found) >= before + 3,
    )
    assert {slot: n for slot, n in slots.items() if n != 1} == {}  # none twice
    assert second.stop() == 0
    for daemon in (first, second):
        # A slot due during the handover may be given up (misfire: skip), not doubled.
        assert problems_logged(daemon.output(), "missed slot(s)") == []
