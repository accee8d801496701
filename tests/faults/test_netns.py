"""Hosts in network namespaces: each reaches Postgres through its proxy, a cut is silent.

Real parts: real namespaces and veths, a real Postgres, psycopg in real processes
inside the hosts (tests/faults/pg_probe.py).
"""

from __future__ import annotations

import ipaddress
import json
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.faults.netns import (
    Host,
    HostNetwork,
    claim_lock,
    collect_stale,
    namespaces,
    require_netns,
)
from tests.support.waiting import wait_for

PROBE = str(Path(__file__).with_name("pg_probe.py"))
REPO = Path(__file__).parents[2]
# A cut connection with the probe's short keepalives ends once nothing has come back
# for tcp_user_timeout (3 s), checked at a 1 s keepalive tick: measured 2.3-3.4 s
# after the cut began. The bound leaves room for a loaded machine.
KEEPALIVE_DETECTION_BOUND_S = 10.0

Hosts = Callable[[int], list[Host]]


def start_probe(host: Host, dsn: str, *options: str) -> subprocess.Popen[str]:
    return host.popen(
        [sys.executable, PROBE, host.dsn(dsn), *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def next_event(probe: subprocess.Popen[str], timeout: float = 30.0) -> dict[str, Any]:
    """The probe's next JSON line, or a failure naming its stderr if none comes in time."""
    assert probe.stdout is not None
    readable, _, _ = select.select([probe.stdout], [], [], timeout)
    line = probe.stdout.readline() if readable else ""
    if not line:
        probe.kill()
        _, stderr = probe.communicate()
        pytest.fail(f"the probe said nothing within {timeout}s; stderr: {stderr}")
    event: dict[str, Any] = json.loads(line)
    return event


def probe_once(host: Host, dsn: str, *options: str) -> dict[str, Any]:
    probe = start_probe(host, dsn, *options)
    while (event := next_event(probe))["event"] != "done":
        pass
    probe.wait()
    return event


def test_hosts_reach_postgres_and_a_cut_silences_only_that_host(
    netns_hosts: Hosts, pg_dsn: str
) -> None:
    a, b = netns_hosts(2)
    assert a.subnet != b.subnet
    assert probe_once(a, pg_dsn)["ok"]
    assert probe_once(b, pg_dsn)["ok"]
    assert (a.proxy.stats.accepted, b.proxy.stats.accepted) == (1, 1)

    a.cut()
    # 5 s: longer than the ~3 s after which unanswered ARP would make A's kernel
    # report "No route to host", which a real partition behind a router does not.
    hung = probe_once(a, pg_dsn, "--connect-timeout", "5")
    assert not hung["ok"]
    # libpq gave up after its own timeout; nothing refused or reset the connection,
    # and the SYN never reached the proxy.
    assert "timeout" in hung["error"], hung
    assert hung["elapsed_s"] >= 4.9, hung
    assert a.proxy.stats.accepted == 1
    assert probe_once(b, pg_dsn)["ok"]

    a.restore()
    assert probe_once(a, pg_dsn)["ok"]
    assert a.proxy.stats.accepted == 2


def sleeping_backends(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as admin:
        row = admin.execute(
            "select count(*) from pg_stat_activity"
            " where datname = current_database() and state = 'active'"
            " and query like 'select pg_sleep%%'"
        ).fetchone()
        return int(row[0]) if row else 0


@pytest.mark.timing
def test_short_keepalives_notice_a_cut_within_a_bound(netns_hosts: Hosts, pg_dsn: str) -> None:
    (host,) = netns_hosts(1)
    probe = start_probe(host, pg_dsn, "--keepalives", "--sleep", "60")
    assert next_event(probe)["event"] == "connected"
    wait_for("the probe's query to run", lambda: sleeping_backends(pg_dsn) == 1)

    cut_at = time.monotonic()
    host.cut()
    done = next_event(probe, timeout=30)
    detected_s = time.monotonic() - cut_at
    assert not done["ok"], done
    # The kernel gave up on the silent connection: a timeout, not a reset or an EOF.
    assert "timed out" in done["error"], done
    assert detected_s < KEEPALIVE_DETECTION_BOUND_S, detected_s
    # Postgres, on the other side of the cut, knows nothing of it yet.
    assert sleeping_backends(pg_dsn) == 1


def test_teardown_removes_everything_even_when_the_test_fails() -> None:
    require_netns()
    with pytest.raises(RuntimeError, match="the test failed"), HostNetwork(2) as hosts:
        sleeper = hosts[0].popen([sys.executable, "-c", "import time; time.sleep(60)"])
        assert all(all(host.leftovers().values()) for host in hosts)  # all built
        raise RuntimeError("the test failed")
    assert sleeper.poll() is not None
    for host in hosts:
        assert not any(host.leftovers().values()), host.leftovers()
    assert not namespaces() & {host.name for host in hosts}


def test_a_host_network_needs_a_host() -> None:
    with pytest.raises(ValueError, match="at least 1 host"):
        HostNetwork(0)


# Builds one host, says what it built, then waits for stdin: a run to kill mid-test.
BUILD_ONE_HOST = """
import sys
from tests.faults.netns import HostNetwork
with HostNetwork(1) as (host,):
    print(host.name, host.root_veth, host.subnet, flush=True)
    sys.stdin.readline()
"""


def test_what_a_killed_run_left_behind_is_collected() -> None:
    require_netns()
    with subprocess.Popen(
        [sys.executable, "-c", BUILD_ONE_HOST],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as killed_run:
        assert killed_run.stdout is not None
        name, root_veth, subnet = killed_run.stdout.readline().split()
        killed_run.kill()
    left = Host(name, root_veth, ipaddress.IPv4Network(subnet))
    try:
        assert all(there for what, there in left.leftovers().items() if "proxy" not in what)
        with claim_lock():
            collect_stale(min_age_s=15 * 60)  # too young to be taken for stale
        assert name in namespaces()
        with claim_lock():
            collect_stale(min_age_s=0)
        assert not any(left.leftovers().values()), left.leftovers()
    finally:
        left.tear_down()  # if the collection failed, do it by hand
