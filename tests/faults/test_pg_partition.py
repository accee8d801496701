"""The daemon on Postgres behind a FaultProxy: a silent partition, a reset, a slow link.

Every connection the daemon opens (children's pools and LISTEN sessions, the parent's
maintenance and metrics threads) goes through the proxy, so a blackhole stops all of
them at once without a FIN or RST, as a dropped NAT entry or a pulled cable does. The
proxy lives in user space, so the kernel under it keeps acknowledging: only the
daemon's own deadlines can notice (see proxy.py). That is the harder case, and the one
that wedged the daemon with a green /healthz before.

Each test asks for `pg_proxy` before `daemon_factory`: fixtures end in the reverse
order, so the daemons stop while the proxy still forwards.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.faults.proxy import FaultProxy
from tests.support.daemon import Daemon, base_config, healthz
from tests.support.harness import client_call, gauge, scrape
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

HANDLERS = ["tests.daemon.fault_handlers:registry"]
#: The stated bound (cairnqd/store/postgres/connect.py): a dead connection is noticed within
#: 30 s. The waits below add room for a loaded two-core machine.
DETECTION_BOUND_S = 30.0
#: After the network returns, queued work resumes within this.
RESUME_BOUND_S = 60.0
OUTAGE_LINE = "database unreachable"
RECOVERY_LINE = "database reachable again"

DaemonFactory = Callable[[dict[str, Any]], Daemon]


def partition_config(tmp_path: Path, dsn: str) -> dict[str, Any]:
    config = base_config(
        tmp_path,
        {"dsn": dsn, "auto_migrate": True, "connect_timeout": "5s"},
        {"default": {"queues": ["default"], "processes": 2, "concurrency": 4, "lease": "30s"}},
    )
    config["handlers"] = HANDLERS
    config["metrics"] = {"listen": "127.0.0.1:0", "stats_ttl": "0s"}
    config["reaper"] = {"interval": "5s"}
    # Generous: a child blocked on a dead socket still heartbeats from its own thread.
    config["supervisor"]["heartbeat_timeout"] = "60s"
    return config


def submit(dsn: str, count: int, **payload: Any) -> list[str]:
    async def go(c: CairnQ) -> list[str]:
        tasks = await c.submit_many([{"name": "f.quick", "payload": payload}] * count)
        return [t.id for t in tasks]

    ids: list[str] = client_call("postgres", dsn, go)
    return ids


def counts(dsn: str) -> dict[str, int]:
    stats = client_call("postgres", dsn, lambda c: c.stats())
    total: dict[str, int] = {}
    for by_status in stats.values():
        for status, n in by_status.items():
            total[status] = total.get(status, 0) + n
    return total


def _scrape_quietly(port: int) -> None:
    with contextlib.suppress(OSError):
        scrape(port)


def db_up(port: int) -> float | None:
    return gauge(scrape(port), "cairnq_db_up")


def outage_lines(daemon: Daemon) -> list[str]:
    return [line for line in daemon.output().splitlines() if OUTAGE_LINE in line]


def start(daemon_factory: DaemonFactory, tmp_path: Path, proxy: FaultProxy, dsn: str) -> Daemon:
    daemon = daemon_factory(partition_config(tmp_path, proxy.dsn(dsn))).start()
    wait_for("both children ready", lambda: len(daemon.children()) == 2, timeout=60)
    return daemon


def drain(dsn: str, total: int, timeout: float) -> None:
    wait_for(
        f"{total} tasks to succeed",
        lambda: (c := counts(dsn)).get("succeeded", 0) == total or c,
        timeout=timeout,
        accept=lambda c: c is True,
    )


@pytest.mark.timing
def test_a_silent_partition_is_detected_reported_once_and_recovers(
    pg_proxy: FaultProxy, daemon_factory: DaemonFactory, tmp_path: Path, pg_dsn: str
) -> None:
    daemon = start(daemon_factory, tmp_path, pg_proxy, pg_dsn)
    port = daemon.metrics_port()
    submit(pg_dsn, 20)
    drain(pg_dsn, 20, timeout=60)
    assert healthz(port)[0] == 200

    pg_proxy.blackhole()
    cut_at = time.monotonic()
    # Queued behind the partition (the test's client reaches Postgres directly).
    submit(pg_dsn, 200)
    _, body = wait_for(
        "/healthz to report the database",
        lambda: healthz(port),
        timeout=DETECTION_BOUND_S + 15,
        accept=lambda r: r[0] == 503,
    )
    assert any("database" in problem for problem in body["problems"]), body
    assert db_up(port) == 0
    wait_for("the outage in the log", lambda: outage_lines(daemon), timeout=DETECTION_BOUND_S)
    assert counts(pg_dsn).get("succeeded", 0) == 20  # nothing got through the cut
    # Keep the partition up long enough for every retry path to run a few times.
    wait_for("10 s of partition", lambda: time.monotonic() - cut_at >= 10, timeout=30)

    pg_proxy.forward()
    restored_at = time.monotonic()
    drain(pg_dsn, 220, timeout=RESUME_BOUND_S)
    # The collector's own session may still sit in psycopg's cancel of the query the cut
    # caught (~10 s) before it reconnects: recovery of /healthz gets the resume bound.
    wait_for(
        "/healthz to recover",
        lambda: healthz(port)[0],
        timeout=RESUME_BOUND_S,
        accept=lambda s: s == 200,
    )
    assert time.monotonic() - restored_at < RESUME_BOUND_S
    wait_for("cairnq_db_up to recover", lambda: db_up(port), accept=lambda v: v == 1)
    wait_for(
        "the recovery in the log",
        lambda: [line for line in daemon.output().splitlines() if RECOVERY_LINE in line],
    )
    # One line when it went, one when it came back: not one per retry or per process.
    assert len(outage_lines(daemon)) == 1, daemon.output()
    recovery = [line for line in daemon.output().splitlines() if RECOVERY_LINE in line]
    assert len(recovery) == 1, daemon.output()
    assert len(daemon.children()) == 2  # recovered in place, no restart needed


def test_reset_connections_recover(
    pg_proxy: FaultProxy, daemon_factory: DaemonFactory, tmp_path: Path, pg_dsn: str
) -> None:
    daemon = start(daemon_factory, tmp_path, pg_proxy, pg_dsn)
    submit(pg_dsn, 50, seconds=0.05)
    wait_for("work to start", lambda: counts(pg_dsn).get("succeeded", 0) > 0, timeout=60)
    pg_proxy.reset()
    pg_proxy.forward()
    submit(pg_dsn, 50)
    drain(pg_dsn, 100, timeout=RESUME_BOUND_S)
    assert len(daemon.children()) == 2


def test_a_slow_link_still_works(
    pg_proxy: FaultProxy, daemon_factory: DaemonFactory, tmp_path: Path, pg_dsn: str
) -> None:
    daemon = start(daemon_factory, tmp_path, pg_proxy, pg_dsn)
    port = daemon.metrics_port()
    pg_proxy.delay(0.2)
    submit(pg_dsn, 40)
    drain(pg_dsn, 40, timeout=RESUME_BOUND_S)
    # Slow is not down: no outage reported.
    assert healthz(port)[0] == 200
    assert outage_lines(daemon) == []
    pg_proxy.forward()  # a stop over the slow link would take the teardown 5 s more


@pytest.mark.timing
def test_sigterm_during_a_partition_exits_within_a_bound(
    pg_proxy: FaultProxy, daemon_factory: DaemonFactory, tmp_path: Path, pg_dsn: str
) -> None:
    config = partition_config(tmp_path, pg_proxy.dsn(pg_dsn))
    config["shutdown_timeout"] = "5s"
    # The scheduler too has a call on a dead connection when the stop comes.
    config["schedules"] = {"tick": {"name": "f.quick", "every": "1s"}}
    daemon = daemon_factory(config).start()
    wait_for("both children ready", lambda: len(daemon.children()) == 2, timeout=60)
    submit(pg_dsn, 20, seconds=2)
    wait_for("work to start", lambda: counts(pg_dsn).get("running", 0) > 0, timeout=60)
    port = daemon.metrics_port()
    pg_proxy.blackhole()
    cut_at = time.monotonic()
    # A scrape (stats_ttl 0s: it reads the database) whose collection hangs on the cut.
    scraping = threading.Thread(target=lambda: _scrape_quietly(port), daemon=True)
    scraping.start()
    # Mid-outage: every process is now stuck in a call on a dead connection.
    wait_for("8 s of partition", lambda: time.monotonic() - cut_at >= 8, timeout=30)
    stopped_at = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc is not None
    # shutdown_timeout (5 s), the hard stop (~1 s), then the scheduler's (5 s) and
    # maintenance's (10 s) own bounds.
    code = daemon.proc.wait(timeout=60)
    assert time.monotonic() - stopped_at < 30, daemon.output()
    assert code == 0, daemon.output()
    # The scheduler and maintenance threads ended: none was abandoned mid-call on a dead
    # socket.
    assert "did not stop" not in daemon.output()
    assert "did not end" not in daemon.output(), daemon.output()
    # Nor was a task of theirs left pending at a loop's close (asyncio logs that as an
    # ERROR): the lead's session was cut short with the store's calls, and maintenance
    # dropped the hand-backs it could no longer make, saying so.
    errors = [line for line in daemon.output().splitlines() if " ERROR " in line]
    assert errors == [], daemon.output()
    assert "job(s) dropped" in daemon.output()
