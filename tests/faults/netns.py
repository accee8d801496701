"""Several "hosts" on one machine: network namespaces wired to the root namespace.

`HostNetwork(n)` creates n network namespaces. Each is a host with one interface, eth0,
the far end of a veth pair whose near end sits in the root namespace; each pair gets
its own /30 out of 10.77.0.0/16 (root side .1, host side .2, default route via .1).
Processes run inside a host with `host.popen(argv)` or `host.command(argv)`, which go
through `ip netns exec`.

Postgres listens on 127.0.0.1 in the root namespace, out of a host's reach, so every
host also gets a FaultProxy listening on its root-side address and forwarding to
Postgres: `host.dsn(pg_dsn)` is the DSN a process inside the host uses, and
`host.proxy` the per-host fault control in user space.

`host.cut()` partitions the host at the network level: its root-side veth goes down, so
every packet either way is dropped without a word, no RST, no ICMP. Why this way:
- The drop happens on the wire, not in the host's own stack, so the host's TCP counts
  its unanswered retransmissions and keepalive probes and gives up on time, as across a
  real partition. (A qdisc that drops in the host's own stack reads to TCP as local
  congestion, which it retries forever; this kernel has no netem or tc filters anyway.)
- The host's neighbour entry for its gateway is permanent. Otherwise, with ARP
  unanswered, the host's kernel would soon report "No route to host", which a real
  partition behind a live router never does.
- A fallback blackhole route in the root namespace keeps the root's packets for a cut
  host from leaking out of the default route while the veth's routes are gone.
`host.restore()` brings the link back; connections from before the cut have usually
timed out by then, new ones work.

Teardown deletes veths, routes and namespaces, and stops the proxies and the processes
started through `popen`, also when the test fails. Names carry the pid and a random
token, and /30s are claimed under a file lock, so parallel runs never collide. What a
run killed before its teardown leaves behind, a later run deletes once it is 15 minutes
old (a namespace lives as long as one test, so an older one with its creator gone is
surely stale).
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.faults.proxy import FaultProxy, postgres_address
from tests.support.databases import REQUIRE_PG, require_postgres
from tests.support.waiting import wait_for

SUPERNET = ipaddress.IPv4Network("10.77.0.0/16")
NAME_PREFIX = "cqf-"
# Marks our fallback routes, so a later run can tell which ones a dead run left behind.
_ROUTE_PROTO = 177
_FALLBACK = f"metric 4000 proto {_ROUTE_PROTO}"
_LOCK_PATH = Path(tempfile.gettempdir()) / "cairnqd-netns.lock"
# A namespace whose creator is gone and that is older than this was left behind.
_STALE_AFTER_S = 15 * 60
_CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21


class NetnsError(RuntimeError):
    """An `ip` command failed while building or tearing down hosts."""


def ip(
    commands: Sequence[str],
    netns: str | None = None,
    *,
    options: Sequence[str] = (),
    check: bool = True,
) -> str:
    """Run `ip` commands (one `ip -batch` process), in `netns` if given; return stdout."""
    argv = ["ip", *options, *(["-n", netns] if netns else []), "-batch", "-"]
    done = subprocess.run(argv, input="\n".join(commands), capture_output=True, text=True)
    if check and done.returncode != 0:
        where = f" in netns {netns}" if netns else ""
        raise NetnsError(f"`ip` failed{where}: {done.stderr.strip()}; commands: {commands}")
    return done.stdout


class Host:
    """One network namespace, its veth pair, its /30 and its proxy to Postgres."""

    def __init__(
        self,
        name: str,
        root_veth: str,
        subnet: ipaddress.IPv4Network,
        *,
        server_keepalive: bool = False,
    ) -> None:
        self.name = name
        self.root_veth = root_veth
        self.subnet = subnet
        self.gateway = str(subnet[1])  # root side; the proxy listens here
        self.address = str(subnet[2])  # host side, on eth0
        # `server_keepalive`: the proxy notices a cut host as a Postgres server with
        # tcp_keepalives_idle/tcp_user_timeout would, and ends its sessions (locks too).
        self.proxy = FaultProxy(
            postgres_address(), listen_host=self.gateway, client_keepalive=server_keepalive
        )
        self._processes: list[subprocess.Popen[str]] = []

    def dsn(self, dsn: str) -> str:
        """`dsn` rewritten to reach its database from inside this host."""
        return self.proxy.dsn(dsn)

    def command(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[str]:
        """Start `argv` inside this host; it is killed at teardown if still running."""
        process = subprocess.Popen(self.command(argv), text=True, **kwargs)
        self._processes.append(process)
        return process

    def cut(self) -> None:
        """Drop every packet to and from this host, silently (see the module doc)."""
        ip([f"link set {self.root_veth} down"])
        wait_for(f"{self.name} to lose its link", lambda: not self.linked(), timeout=10)

    def restore(self) -> None:
        ip([f"link set {self.root_veth} up"])
        wait_for(f"{self.name} to get its link back", self.linked, timeout=10)

    def linked(self) -> bool:
        """Whether both ends of the veth carry traffic."""
        root = ip([f"link show dev {self.root_veth}"], options=["-o"])
        inside = ip(["link show dev eth0"], self.name, options=["-o"])
        return "LOWER_UP" in root and "LOWER_UP" in inside

    def build(self) -> None:
        ip(
            [
                f"link add {self.root_veth} type veth peer name eth0 netns {self.name}",
                f"addr add {self.gateway}/30 dev {self.root_veth}",
                f"link set {self.root_veth} up",
                f"route replace blackhole {self.subnet} {_FALLBACK}",
            ]
        )
        mac = Path(f"/sys/class/net/{self.root_veth}/address").read_text().strip()
        ip(
            [
                "link set lo up",
                f"addr add {self.address}/30 dev eth0",
                "link set eth0 up",
                f"route add default via {self.gateway}",
                f"neigh replace {self.gateway} lladdr {mac} dev eth0 nud permanent",
            ],
            self.name,
        )
        wait_for(f"{self.name} to get its link", self.linked, timeout=10)
        self.proxy.start()

    def tear_down(self) -> None:
        for process in self._processes:
            with process:  # closes its pipes and reaps it
                if process.poll() is None:
                    process.kill()
        self.proxy.stop()
        # The route first: a parallel run collects fallback routes whose address is gone.
        ip([f"route del blackhole {self.subnet} {_FALLBACK}"], check=False)
        # Deleting the root end deletes both ends at once; deleting only the namespace
        # would leave that to the kernel's cleanup work, later.
        ip([f"link del {self.root_veth}"], check=False)
        ip([f"netns del {self.name}"], check=False)
        left = [what for what, there in self.leftovers().items() if there]
        if left:
            raise NetnsError(f"teardown of host {self.name} left behind: {', '.join(left)}")

    def leftovers(self) -> dict[str, bool]:
        """Which of this host's pieces still exist (all False after teardown)."""
        return {
            f"netns {self.name}": self.name in namespaces(),
            f"veth {self.root_veth}": Path(f"/sys/class/net/{self.root_veth}").exists(),
            f"route {self.subnet}": str(self.subnet) in ip([f"route show {self.subnet}"]),
            f"proxy on {self.gateway}": self.proxy.running,
        }


def namespaces() -> set[str]:
    return {line.split()[0] for line in ip(["netns list"]).splitlines() if line.strip()}


class HostNetwork:
    """`count` hosts, built on entry and torn down on exit (see the module doc)."""

    def __init__(self, count: int, *, server_keepalive: bool = False) -> None:
        if count < 1:
            raise ValueError(f"a host network needs at least 1 host, got {count}")
        self.count = count
        self.server_keepalive = server_keepalive
        self.hosts: list[Host] = []

    def __enter__(self) -> list[Host]:
        token = secrets.token_hex(3)
        try:
            with claim_lock():
                collect_stale()
                for index, subnet in enumerate(_free_subnets(self.count)):
                    name, root_veth = _host_names(os.getpid(), token, index)
                    ip([f"netns add {name}"])
                    host = Host(name, root_veth, subnet, server_keepalive=self.server_keepalive)
                    self.hosts.append(host)
                    host.build()  # the root-side address claims the /30: inside the lock
        except BaseException as exc:
            try:
                self.__exit__()
            except NetnsError as teardown:
                exc.add_note(f"and tearing down what was built failed: {teardown}")
            raise
        return list(self.hosts)

    def __exit__(self, *_exc: object) -> None:
        errors: list[str] = []
        for host in self.hosts:
            try:
                host.tear_down()
            except NetnsError as exc:
                errors.append(str(exc))
        self.hosts.clear()
        if errors:
            raise NetnsError("; ".join(errors))


def _host_names(pid: int, token: str, index: int) -> tuple[str, str]:
    """A host's namespace and root-side veth names (a veth name has 15 chars at most)."""
    return f"{NAME_PREFIX}{pid}-{token}-{index}", f"cqf{token}r{index}"


@contextmanager
def claim_lock() -> Iterator[None]:
    """Held while claiming /30s and collecting stale hosts, across all test runs."""
    with _LOCK_PATH.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _root_addresses() -> set[ipaddress.IPv4Address]:
    found = set()
    for line in ip(["addr show"], options=["-4", "-o"]).splitlines():
        # "7: cqf...r0    inet 10.77.0.1/30 brd ... scope global ..."
        fields = line.split()
        if "inet" in fields:
            found.add(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).ip)
    return found


def _free_subnets(count: int) -> list[ipaddress.IPv4Network]:
    used = _root_addresses()
    free = (net for net in SUPERNET.subnets(new_prefix=30) if not used & set(net))
    subnets = [next(free, None) for _ in range(count)]
    if None in subnets:
        raise NetnsError(f"no {count} free /30 subnets left in {SUPERNET}")
    return [net for net in subnets if net is not None]


def collect_stale(min_age_s: float = _STALE_AFTER_S) -> None:
    """Delete the hosts that runs killed before their teardown left behind.

    A host is stale when the run that built it is gone and it is older than
    `min_age_s`; call with `claim_lock()` held.
    """
    for name in namespaces():
        parts = name.removeprefix(NAME_PREFIX).split("-")
        if not name.startswith(NAME_PREFIX) or len(parts) != 3 or not parts[0].isdigit():
            continue
        if _stale(name, int(parts[0]), min_age_s):
            _, root_veth = _host_names(int(parts[0]), parts[1], int(parts[2]))
            ip([f"link del {root_veth}"], check=False)
            ip([f"netns del {name}"], check=False)
    addresses = _root_addresses()
    for line in ip([f"route show proto {_ROUTE_PROTO}"], options=["-4"]).splitlines():
        subnet = ipaddress.IPv4Network(line.split()[1])  # "blackhole 10.77.0.0/30 proto ..."
        if not addresses & set(subnet):
            ip([f"route del blackhole {subnet} {_FALLBACK}"], check=False)


def _stale(name: str, pid: int, min_age_s: float) -> bool:
    if Path(f"/proc/{pid}").exists():
        return False
    try:
        age_s = time.time() - Path(f"/run/netns/{name}").stat().st_mtime
    except OSError:
        return True
    return age_s >= min_age_s


def has_capabilities(*bits: int) -> bool:
    """Whether this process holds every capability numbered in `bits` (CapEff)."""
    status = Path("/proc/self/status").read_text().splitlines()
    effective = int(next(line.split()[1] for line in status if line.startswith("CapEff")), 16)
    return all(effective >> bit & 1 for bit in bits)


def require_netns() -> None:
    """Skip the test when hosts cannot be built here; in CI a missing `ip` fails it."""
    require_postgres()
    if not has_capabilities(_CAP_NET_ADMIN, CAP_SYS_ADMIN):
        pytest.skip("network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN (run as root)")
    if shutil.which("ip") is None:
        message = "iproute2's `ip` is not installed, so no network namespaces"
        if REQUIRE_PG:
            pytest.fail(f"{message}; CI installs it in .ci/run")
        pytest.skip(message)


@pytest.fixture
def netns_hosts() -> Iterator[Callable[..., list[Host]]]:
    """`netns_hosts(n)` builds n hosts for this test; all are torn down after it.
    `server_keepalive=True` makes Postgres (through the proxies) notice a cut host."""
    with ExitStack() as stack:

        def build(count: int, *, server_keepalive: bool = False) -> list[Host]:
            require_netns()
            return stack.enter_context(HostNetwork(count, server_keepalive=server_keepalive))

        yield build
