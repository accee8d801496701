"""Two daemons on two hosts against one Postgres; one host is cut off past its lease.

Each daemon runs in a network namespace of its own (tests/faults/netns.py) and reaches
Postgres through its host's proxy, which also stands in for the server's own TCP
keepalives (`server_keepalive`): once a host is cut, Postgres ends its sessions within
seconds, as a server with `tcp_keepalives_idle`/`tcp_user_timeout` set would, and the
locks those sessions held go with them.

What must hold when host A is cut off for longer than the lease: the tasks it held are
recovered and finished by host B while A is still away; the stats leadership (a session
advisory lock) moves to B; B keeps purging; nothing A writes late lands (the protocol
fences a write by worker and attempt); every task ends terminal once A is back, and no
task ever ran in two places at once.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cairnqd import CairnQ
from tests.faults.netns import Host
from tests.support.daemon import REPO, Daemon, base_config
from tests.support.executions import Execution, executions
from tests.support.harness import client_call
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

LEASE_S = 6
#: The stats leader's lock: (database.lock_namespace default, 2).
LOCK_NAMESPACE = 0x63716E64
STATS_LOCK_ID = 2
TERMINAL = ("succeeded", "failed", "canceled")

Hosts = Callable[..., list[Host]]


class HostDaemon(Daemon):
    """A `Daemon` started inside `host`, labelled `label` (the handlers' CAIRNQD_TEST_HOST)."""

    def __init__(self, tmp: Path, config: dict[str, Any], host: Host, label: str) -> None:
        tmp.mkdir()
        super().__init__(tmp, config)
        self.host = host
        self.label = label

    def start(self) -> HostDaemon:
        env = {
            **os.environ,
            "NOTIFY_SOCKET": self.notify_path,
            "PYTHONPATH": str(REPO),
            "CAIRNQD_TEST_HOST": self.label,
        }
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        # `ip netns exec` execs the daemon: its pid is the daemon's, signals reach it.
        self.proc = subprocess.Popen(
            self.host.command([sys.executable, "-m", "cairnqd.cli", "-c", str(self.config_path)]),
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=self.tmp,
        )
        self.wait_notify("READY=1", timeout=60)
        wait_for(f"{self.label}'s children", lambda: len(self.children()) == 2, timeout=60)
        return self

    def url(self, path: str) -> str:
        return f"http://{self.host.address}:{self.metrics_port()}{path}"

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url("/metrics"), timeout=10) as resp:
            return str(resp.read().decode())

    def healthz(self) -> int:
        try:
            with urllib.request.urlopen(self.url("/healthz"), timeout=10) as resp:
                json.loads(resp.read())
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code


def host_config(tmp: Path, host: Host, pg_dsn: str, label: str) -> dict[str, Any]:
    dsn = psycopg.conninfo.make_conninfo(host.dsn(pg_dsn), application_name=f"cairnqd-{label}")
    config = base_config(
        tmp,
        {"dsn": dsn, "auto_migrate": True, "connect_timeout": "3s", "expected_hosts": 2},
        {
            "default": {
                "queues": ["default", "fodder"],
                "processes": 2,
                "concurrency": 4,
                "lease": f"{LEASE_S}s",
            }
        },
    )
    config["handlers"] = ["tests.faults.host_handlers:registry"]
    # Reachable from the test's namespace at the host's address.
    config["metrics"] = {"listen": "0.0.0.0:0", "stats_ttl": "0s", "queue_stats": "leader"}
    config["reaper"] = {"interval": "1s"}
    config["retention"] = {
        "interval": "2s",
        "rules": [{"queue": "fodder", "status": "succeeded", "older_than": "1s"}],
    }
    config["supervisor"]["heartbeat_timeout"] = "60s"
    return config


def stats_leader(pg_dsn: str) -> str | None:
    """The application_name of the session holding the stats leader's lock, if any."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            "select a.application_name from pg_locks l join pg_stat_activity a using (pid)"
            " where l.locktype = 'advisory' and l.granted and l.classid::bigint = %s"
            " and l.objid::bigint = %s and l.objsubid = 2",
            [LOCK_NAMESPACE, STATS_LOCK_ID],
        ).fetchone()
        return None if row is None else str(row[0])


def leads(daemon: HostDaemon, pg_dsn: str) -> bool:
    daemon.scrape()  # a scrape refreshes the statistics, which takes or keeps the lock
    return stats_leader(pg_dsn) == f"cairnqd-{daemon.label}"


def submit(pg_dsn: str, count: int, queue: str = "default", **payload: Any) -> list[str]:
    async def go(c: CairnQ) -> list[str]:
        tasks = await c.submit_many(
            [{"name": "h.work", "payload": payload, "queue": queue, "max_attempts": 5}] * count
        )
        return [t.id for t in tasks]

    ids: list[str] = client_call("postgres", pg_dsn, go)
    return ids


def rows(pg_dsn: str, ids: list[str]) -> list[Any]:
    async def go(c: CairnQ) -> list[Any]:
        return [await c.get(i) for i in ids]

    found: list[Any] = client_call("postgres", pg_dsn, go)
    return found


def all_terminal(pg_dsn: str, ids: list[str]) -> list[Any]:
    """The rows once every one of them is terminal; [] until then."""
    found = rows(pg_dsn, ids)
    return found if all(t is not None and t.status in TERMINAL for t in found) else []


def running_count(pg_dsn: str) -> int:
    """How many tasks are claimed and not settled."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = conn.execute("select count(*) from cairnq_tasks where status = 'running'").fetchone()
        return 0 if row is None else int(row[0])


def queue_total(pg_dsn: str, queue: str) -> int:
    stats = client_call("postgres", pg_dsn, lambda c: c.stats(queue))
    return sum(sum(by_status.values()) for by_status in stats.values())


def lines(daemon: Daemon, text: str) -> list[str]:
    return [line for line in daemon.output().splitlines() if text in line]


def overlapping(runs: list[Execution]) -> list[tuple[Execution, Execution]]:
    """Pairs of executions of one task whose run times overlap."""
    found = []
    by_task: dict[str, list[Execution]] = {}
    for run in runs:
        by_task.setdefault(run.task_id, []).append(run)
    for task_runs in by_task.values():
        task_runs.sort(key=lambda r: r.started)
        for earlier, later in itertools.pairwise(task_runs):
            if earlier.ended is None or later.started < earlier.ended:
                found.append((earlier, later))
    return found


def test_a_host_cut_off_past_its_lease_loses_its_work_and_leadership_and_nothing_else(
    netns_hosts: Hosts, pg_dsn: str, tmp_path: Path
) -> None:
    a, b = netns_hosts(2, server_keepalive=True)
    log = tmp_path / "executions.log"
    daemons: list[HostDaemon] = []
    try:
        host_a = HostDaemon(tmp_path / "a", host_config(tmp_path / "a", a, pg_dsn, "A"), a, "A")
        daemons.append(host_a.start())
        wait_for("A to lead the statistics", lambda: leads(host_a, pg_dsn))
        host_b = HostDaemon(tmp_path / "b", host_config(tmp_path / "b", b, pg_dsn, "B"), b, "B")
        daemons.append(host_b.start())
        assert not leads(host_b, pg_dsn)

        # Enough 2 s tasks that both hosts hold some when A is cut.
        ids = submit(pg_dsn, 48, seconds=2, log=str(log))
        a_log, b_log = Path(f"{log}.A"), Path(f"{log}.B")
        wait_for("A to be running tasks", lambda: len(executions(a_log)) >= 4, timeout=60)
        a.cut()

        # A's tasks come back to the queue when their leases expire and B runs them,
        # all while A is still cut off.
        done = wait_for("every task to end on B", lambda: all_terminal(pg_dsn, ids), timeout=120)
        assert [t.status for t in done] == ["succeeded"] * len(ids)
        lost_on_a = {
            run.task_id
            for run in executions(a_log)
            if run.task_id in {t.id for t in done if t.result["host"] == "B"}
        }
        assert lost_on_a, "A held nothing when it was cut off"

        # The statistics leadership moves to B once Postgres has ended A's session.
        wait_for("B to lead the statistics", lambda: leads(host_b, pg_dsn), timeout=60)
        # B purges on its own: finished `fodder` tasks disappear.
        fodder = submit(pg_dsn, 5, queue="fodder")
        assert fodder
        wait_for("B to purge", lambda: queue_total(pg_dsn, "fodder") == 0, timeout=60)
        # The sweep logs once its cleanup after the delete is done, a moment later.
        wait_for("B to log its purge", lambda: "purge sweep deleted" in host_b.output(), timeout=30)

        # A knows it is cut off, and says so once (within the 30 s detection bound).
        wait_for("A to notice", lambda: lines(host_a, "database unreachable"), timeout=45)
        a.restore()
        # A works again by itself, no restart: healthy, and it runs some of a new batch.
        wait_for("A to recover", host_a.healthz, timeout=90, accept=lambda s: s == 200)
        more = submit(pg_dsn, 48, seconds=0.5, log=str(log))
        finished = wait_for("the new batch", lambda: all_terminal(pg_dsn, more), timeout=90)
        assert [t.status for t in finished] == ["succeeded"] * len(more)
        assert {run.task_id for run in executions(a_log)} & set(more)
        assert len(host_a.children()) == 2

        # A's late writes were refused: every task kept the result of its last attempt,
        # and those A lost kept B's.
        final = rows(pg_dsn, ids)
        for task in final:
            assert task.result["attempt"] == task.attempt, task
        assert all(t.result["host"] == "B" for t in final if t.id in lost_on_a)
        assert len(lines(host_a, "database unreachable")) == 1, host_a.output()
        assert len(lines(host_a, "database reachable again")) == 1, host_a.output()
        # No task ran in two places at once.
        runs = executions(a_log) + executions(b_log)
        assert overlapping(runs) == []
    finally:
        for daemon in daemons:
            daemon.stop()


def most_at_once(runs: list[Execution]) -> tuple[int, float]:
    """The most executions running at one instant, and the first instant it was reached
    (an execution without an end counts until the last recorded instant)."""
    last = max([r.started for r in runs] + [r.ended for r in runs if r.ended is not None])
    events = sorted(
        [(r.started, 1) for r in runs] + [(last if r.ended is None else r.ended, -1) for r in runs]
    )
    most, now, at = 0, 0, 0.0
    for when, step in events:  # an end at the same instant as a start sorts first
        now += step
        if now > most:
            most, at = now, when
    return most, at


def test_a_limit_holds_across_hosts_and_a_cut_off_host_gives_its_room_back(
    netns_hosts: Hosts, pg_dsn: str, tmp_path: Path
) -> None:
    """Two hosts keep one `concurrency: 3` budget between them. Host A works alone, then
    is cut off holding whatever room its unsettled claims hold; it keeps that room until
    its leases pass, and not longer: B, started after the cut, runs in what is left, then
    three at once. The limit is never exceeded, A's runs included."""
    a, b = netns_hosts(2, server_keepalive=True)
    log = tmp_path / "executions.log"
    limits = {"smtp": {"queues": ["default"], "concurrency": 3}}
    daemons: list[HostDaemon] = []

    def start(host: Host, label: str) -> HostDaemon:
        config = host_config(tmp_path / label, host, pg_dsn, label)
        config["limits"] = limits
        daemon = HostDaemon(tmp_path / label, config, host, label)
        daemons.append(daemon)
        return daemon.start()

    try:
        start(a, "A")
        ids = submit(pg_dsn, 40, seconds=1, log=str(log))
        a_log, b_log = Path(f"{log}.A"), Path(f"{log}.B")
        wait_for("A to use the whole budget", lambda: len(executions(a_log)) >= 3, timeout=60)
        a.cut()
        cut_at = time.monotonic()
        # What A holds is what the server committed before the cut. A task that ended
        # just then may have settled without a claim in the same commit: A holds 2 or 3.
        held = running_count(pg_dsn)
        assert 1 <= held <= 3, held
        start(b, "B")
        done = wait_for("every task to end on B", lambda: all_terminal(pg_dsn, ids), timeout=180)
        assert [t.status for t in done] == ["succeeded"] * len(ids)
        # Never more than 3 at once over both hosts, A's runs cut short included.
        runs = executions(a_log) + executions(b_log)
        assert most_at_once(runs)[0] <= 3
        assert overlapping(runs) == []
        # While A's leases ran (6 s, renewed every 2 s: they end 4 to 6 s after the cut),
        # B ran in the room A did not hold, and no more.
        b_runs = executions(b_log)
        lease_end = cut_at + LEASE_S * 2 / 3 - 1
        early = [r for r in b_runs if r.started < lease_end]
        assert (most_at_once(early)[0] if early else 0) <= 3 - held, (held, early)
        # Then B alone used the whole budget, within seconds of the leases' end.
        most, reached = most_at_once(b_runs)
        assert most == 3
        assert reached - cut_at < LEASE_S + 15, reached - cut_at
        a.restore()
    finally:
        for daemon in daemons:
            daemon.stop()
