"""Run the real daemon in a subprocess and watch it from a test.

`Daemon` writes a config, starts `python -m cairnqd.cli -c FILE` with a NOTIFY_SOCKET
the test owns, and offers condition waits (tests/support/waiting.py, never bare sleeps),
child discovery from /proc titles, signals, and a store on the same database for
assertions. `gone` says whether a process (a child, or one a handler started) has exited.

A pytest plugin (tests/conftest.py registers it): `daemon_factory` builds daemons for a
test and stops them when it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import REPO, cli
from tests.support.databases import PgDatabases
from tests.support.waiting import wait_for


def base_config(tmp: Path, database: dict[str, Any], groups: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": 1,
        "database": database,
        "handlers": ["tests.daemon.handlers:registry"],
        "shutdown_timeout": "10s",
        "runtime_dir": str(tmp / "run"),
        "metrics": {"listen": "127.0.0.1:0"},
        "retention": {"rules": []},
        "supervisor": {
            "restart_budget": 1000,
            "backoff_max": "500ms",
            "heartbeat_interval": "500ms",
            "heartbeat_timeout": "10s",
        },
        "groups": groups,
    }


def write_config(tmp: Path, config: dict[str, Any]) -> Path:
    """Write `config` where a `Daemon` in `tmp` reads it, without starting one."""
    (tmp / "run").mkdir(exist_ok=True)
    path = tmp / "cairnq.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def healthz(port: int) -> tuple[int, dict[str, Any]]:
    """A daemon's /healthz, scraped over HTTP: (status code, its JSON body)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie left to an unreaping subreaper counts)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


class Daemon:
    def __init__(self, tmp: Path, config: dict[str, Any]) -> None:
        self.tmp = tmp
        self.config_path = tmp / "cairnq.yaml"
        self.write_config(config)
        self.notify_path = str(tmp / "notify.sock")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        self.notify.settimeout(0.05)
        self.messages: list[str] = []
        self.log_path = tmp / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def write_config(self, config: dict[str, Any]) -> None:
        write_config(self.tmp, config)

    def start(
        self,
        *,
        wait_ready: bool = True,
        own_group: bool = False,
        env: dict[str, str] | None = None,
    ) -> Daemon:
        """Start the daemon; with `own_group`, as a terminal starts a foreground job:
        leader of a process group of its own, which `killpg` can signal as a whole
        (Ctrl-C) without reaching the test runner. `env` adds to (or overrides) the
        environment, PYTHONPATH included."""
        env = {
            **os.environ,
            "NOTIFY_SOCKET": self.notify_path,
            "PYTHONPATH": str(REPO),
            **(env or {}),
        }
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cairnqd.cli", "-c", str(self.config_path)],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=self.tmp,
            process_group=0 if own_group else None,
        )
        if wait_ready:
            self.wait_notify("READY=1", timeout=60)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def poll_notify(self) -> None:
        while True:
            try:
                data = self.notify.recv(65536)
            except (TimeoutError, BlockingIOError):
                return
            self.messages.extend(data.decode().splitlines())

    def wait_notify(self, line: str, timeout: float = 30.0, start: int = 0) -> int:
        """Wait for a notify line starting with `line`; returns its index."""

        def seen() -> int | None:
            self.poll_notify()
            for i, m in enumerate(self.messages[start:], start):
                if m.startswith(line):
                    return i + 1
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.output()}")
            return None

        return wait_for(f"notify {line!r}", seen, timeout) - 1

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def children(self, group: str | None = None) -> dict[int, str]:
        """pid -> process title of the daemon's live worker children."""
        return {
            pid: title
            for pid, title in _processes().items()
            if title.startswith("cairnqd: worker")
            and _parent(pid) == self.pid
            and (group is None or f"[{group}]" in title)
        }

    def title(self) -> str:
        return Path(f"/proc/{self.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()

    def metrics_port(self) -> int:
        """The bound metrics port, from the daemon's log line."""

        def port() -> int | None:
            for line in self.output().splitlines():
                if "metrics on http://" in line:
                    return int(line.rsplit(":", 1)[1].split("/")[0])
            return None

        return wait_for("metrics port in the log", port, 30)

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run `cairnqd -c <this config> ARGS` (e.g. `reload --wait 30s`) to the end."""
        return cli(self.config_path, *args, timeout=timeout)

    def state(self) -> dict[str, Any]:
        """The daemon's state file (generation, last reload)."""
        (path,) = (self.tmp / "run").glob("cairnqd-*.json")
        state: dict[str, Any] = json.loads(path.read_text())
        return state

    def snapshot(self) -> dict[str, Any]:
        """What `cairnqd status --json` shows (groups, children, their running tasks),
        asked of the control socket beside the state file."""
        from cairnqd.daemon.parent.control import ask_daemon, control_path

        (path,) = (self.tmp / "run").glob("cairnqd-*.json")
        return ask_daemon(control_path(str(path)))

    def running_tasks(self, group: str) -> dict[str, int]:
        """Task id -> pid of the child of `group` whose handler runs it, as the
        children's last heartbeats said."""
        return {
            task["id"]: child["pid"]
            for g in self.snapshot()["groups"]
            if g["name"] == group
            for child in g["children"]
            for task in child.get("running", [])
        }

    def master_pid(self) -> int:
        """The pid serving now: after a binary upgrade (`cairnqd upgrade`) the
        successor's, from the state file, not the process this harness started."""
        return int(self.state()["pid"])

    def workers(self) -> dict[int, str]:
        """pid -> title of every worker child of any master of this config: the old
        parent's and its successor's during an upgrade."""
        masters = {pid for pid, title in _processes().items() if _is_master(title, self)}
        return {
            pid: title
            for pid, title in _processes().items()
            if title.startswith("cairnqd: worker") and _parent(pid) in masters
        }

    def stop(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        self._stop_successor(timeout)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.notify.close()
        return self.proc.returncode

    def _stop_successor(self, timeout: float) -> None:
        """A master that took over from the one we started is stopped too."""
        try:
            pid = self.master_pid()
        except (ValueError, KeyError, OSError, json.JSONDecodeError):
            return
        if pid == self.pid or gone(pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        try:
            wait_for(f"the successor master {pid} to exit", lambda: gone(pid), timeout)
        except AssertionError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _processes() -> dict[int, str]:
    """pid -> title of every live process (zombies have no title and are left out)."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if raw:
            found[int(entry.name)] = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _is_master(title: str, daemon: Daemon) -> bool:
    return title.startswith(f"cairnqd: master [{daemon.config_path}]")


@pytest.fixture
def daemon_factory(
    tmp_path: Path, pg_databases: PgDatabases
) -> Iterator[Callable[[dict[str, Any]], Daemon]]:
    """Builds `Daemon`s for the test; stops every one of them afterwards.

    Asks for `pg_databases` so that fixture is set up first and ends last: the daemons
    stop before the test's databases are dropped. A daemon stopped after its database
    was dropped under it retried its hand-backs for 10-20 s before it gave up."""
    started: list[Daemon] = []

    def make(config: dict[str, Any]) -> Daemon:
        daemon = Daemon(tmp_path, config)
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        daemon.stop()
