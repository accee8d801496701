"""Reloads under the real daemon: what changes, what stays, and what `reload --wait` says.

SQLite only: these exercise the supervisor's bookkeeping, not the store.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from tests.support.daemon import base_config
from tests.support.harness import client_call, database_section, gauge, scrape
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def config_for(tmp_path: Path, db: str, groups: dict[str, Any]) -> dict[str, Any]:
    return base_config(tmp_path, database_section("sqlite", db), groups)


def test_a_reload_without_changes_keeps_the_generation(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(tmp_path, sqlite_path, {"g": {"queues": ["q"], "processes": 2}})
    daemon = daemon_factory(config).start()
    before = set(daemon.children("g"))
    done = daemon.cli("reload", "--wait", "30s")
    assert done.returncode == 0, done.stderr
    assert "generation 1" in done.stdout
    assert daemon.state()["generation"] == 1
    assert "nothing changed; still generation 1" in daemon.output()
    assert set(daemon.children("g")) == before
    # A hot setting: a new generation, the change logged, no child replaced.
    config["logging"] = {"level": "debug"}
    daemon.write_config(config)
    done = daemon.cli("reload", "--wait", "30s")
    assert done.returncode == 0, done.stderr
    assert daemon.state()["generation"] == 2
    assert "reload: settings applied in place: logging.level" in daemon.output()
    assert gauge(scrape(daemon.metrics_port()), "cairnq_config_generation") == 2.0
    assert set(daemon.children("g")) == before
    assert daemon.stop() == 0


def test_a_shrink_drops_the_removed_slot_s_memory_series(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(tmp_path, sqlite_path, {"g": {"queues": ["q"], "processes": 2}})
    daemon = daemon_factory(config).start()
    port = daemon.metrics_port()

    def rss(slot: str) -> float | None:
        return gauge(scrape(port), "cairnq_child_resident_memory_bytes", group="g", slot=slot)

    wait_for("both slots' memory series", lambda: rss("0") and rss("1"))
    config["groups"]["g"]["processes"] = 1
    daemon.write_config(config)
    done = daemon.cli("reload", "--wait", "30s")
    assert done.returncode == 0, done.stderr
    wait_for("the retired child to exit", lambda: len(daemon.children("g")) == 1)
    wait_for("slot 1's series to go", lambda: rss("1") is None)
    assert rss("0")
    assert daemon.stop() == 0


FLAKY = "tests.daemon.flaky_handlers:registry"


def submit_blocking(db: str, name: str, release: Path, queue: str) -> Any:
    async def submit(c: CairnQ) -> Any:
        return await c.submit(name, {"until": str(release)}, queue=queue)

    return client_call("sqlite", db, submit)


def running_on(daemon: Any, db: str, task_id: str, group: str, processes: int) -> int:
    """The pid of the child of `group` running `task_id` (its worker_id names the slot)."""

    def worker_id() -> str | None:
        task = client_call("sqlite", db, lambda c: c.get(task_id))
        return task.worker_id if task.status == "running" else None

    slot = int(wait_for("the task to start", worker_id, 60).split(":")[1].split(".")[1])
    return next(p for p, t in daemon.children(group).items() if f"] {slot + 1}/{processes}" in t)


def test_a_reload_revives_a_fatal_group_without_losing_its_children(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(
        tmp_path,
        sqlite_path,
        {"g": {"queues": ["q"], "processes": 2, "concurrency": 1, "handlers": [FLAKY]}},
    )
    config["supervisor"]["fatal_cooldown"] = "1h"  # only the reload brings it back
    daemon = daemon_factory(config).start()
    release = tmp_path / "release"
    task = submit_blocking(sqlite_path, "f.block", release, "q")
    busy = running_on(daemon, sqlite_path, task.id, "g", 2)
    (idle,) = set(daemon.children("g")) - {busy}
    (tmp_path / "handlers-broken").touch()
    os.kill(idle, signal.SIGKILL)  # its replacement cannot import the handlers
    wait_for("the group to go FATAL", lambda: "group g is FATAL" in daemon.output())
    assert set(daemon.children("g")) == {busy}  # a FATAL group keeps what still runs
    (tmp_path / "handlers-broken").unlink()
    done = daemon.cli("reload", "--wait", "30s")
    assert done.returncode == 0, done.stderr
    assert "group g was FATAL: starting it again" in daemon.output()
    port = daemon.metrics_port()
    wait_for(
        "two ready children",
        lambda: gauge(scrape(port), "cairnq_children", group="g", state="ready") == 2.0,
    )
    # The busy child kept its slot: the pool filled the other one, not two new ones.
    children = set(daemon.children("g"))
    assert busy in children and len(children) == 2, (busy, children, daemon.output())
    release.touch()
    done_task = client_call("sqlite", sqlite_path, lambda c: c.wait(task.id, timeout_ms=30_000))
    assert done_task.status == "succeeded" and done_task.result["pid"] == busy
    assert "bookkeeping bug" not in daemon.output()
    assert daemon.stop() == 0


@pytest.mark.timing
def test_a_roll_does_not_wait_for_a_long_task_past_shutdown_timeout(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    group = {"queues": ["q"], "processes": 1, "concurrency": 1, "lease": "60s"}
    config = config_for(tmp_path, sqlite_path, {"g": {**group, "shutdown_timeout": "2s"}})
    daemon = daemon_factory(config).start()
    task = submit_blocking(sqlite_path, "t.block", tmp_path / "never", "q")
    old = running_on(daemon, sqlite_path, task.id, "g", 1)
    old_worker = client_call("sqlite", sqlite_path, lambda c: c.get(task.id)).worker_id
    config["groups"]["g"]["lease"] = "45s"
    daemon.write_config(config)
    started = time.monotonic()
    done = daemon.cli("reload", "--wait", "40s")
    assert done.returncode == 0, (done.stdout, done.stderr, daemon.output())
    assert time.monotonic() - started < 25, "the roll waited for the task"
    assert "still draining at its shutdown_timeout" in daemon.output()
    assert old not in daemon.children("g")

    def handed_back() -> bool:
        got = client_call("sqlite", sqlite_path, lambda c: c.get(task.id))
        # The roll cut it short: its attempt is given back, and the new child may
        # already run it again, under that same attempt.
        return got.attempt <= 1 and got.worker_id != old_worker

    wait_for("the old child's task to be handed back", handed_back, timeout=10)
    assert "bookkeeping bug" not in daemon.output()
    assert daemon.stop() == 0


def test_a_new_child_that_dies_before_ready_stops_the_roll(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(tmp_path, sqlite_path, {"g": {"queues": ["q"], "processes": 2}})
    daemon = daemon_factory(config).start()
    before = set(daemon.children("g"))
    config["groups"]["g"]["handlers"] = ["tests.daemon.exit_handlers:registry"]
    daemon.write_config(config)
    done = daemon.cli("reload", "--wait", "30s")
    assert done.returncode == 78, (done.stdout, done.stderr)
    assert "group g slot 0: the new child" in done.stderr
    assert "exit 1" in done.stderr
    assert "reload failed: generation 2 is not running everywhere" in done.stderr
    assert set(daemon.children("g")) == before  # the old code still serves every slot
    result = client_call("sqlite", sqlite_path, lambda c: c.call("t.echo", 1, queue="q"))
    assert result == 1
    assert "bookkeeping bug" not in daemon.output()
    assert daemon.stop() == 0


def healthz_status(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)


def assert_the_loop_runs(daemon: Any) -> None:
    """A killed child is reaped and replaced, and /healthz sees a fresh loop."""
    (child,) = daemon.children("g")
    os.kill(child, signal.SIGKILL)
    wait_for(
        "the killed child to be replaced",
        lambda: (now := daemon.children("g")) and child not in now,
        timeout=15,
    )
    assert healthz_status(daemon.metrics_port()) == 200


def test_a_config_file_that_blocks_does_not_stall_the_loop(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(tmp_path, sqlite_path, {"g": {"queues": ["q"], "processes": 1}})
    daemon = daemon_factory(config).start()
    text = daemon.config_path.read_text()
    daemon.config_path.unlink()
    os.mkfifo(daemon.config_path)  # reading it blocks until the test writes the config
    try:
        mark = len(daemon.messages)
        daemon.signal(signal.SIGHUP)
        daemon.wait_notify("RELOADING=1", start=mark)
        assert_the_loop_runs(daemon)
        assert daemon.state()["reload"]["seq"] == 0  # still loading
        with open(daemon.config_path, "w") as fifo:
            fifo.write(text)
        wait_for("the reload's outcome", lambda: daemon.state()["reload"]["seq"] == 1)
        assert daemon.state()["reload"]["ok"], daemon.state()
    finally:
        unblock(daemon.config_path, text)
    assert daemon.stop() == 0


def test_an_alias_bomb_on_sighup_is_refused_and_the_loop_goes_on(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    config = config_for(tmp_path, sqlite_path, {"g": {"queues": ["q"], "processes": 1}})
    daemon = daemon_factory(config).start()
    bomb = daemon.config_path.read_text() + "".join(
        f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9) if n else 'lol'}]\n" for n in range(10)
    )
    daemon.config_path.write_text(bomb)
    daemon.signal(signal.SIGHUP)
    wait_for("the refusal", lambda: daemon.state()["reload"]["seq"] == 1, timeout=10)
    reload = daemon.state()["reload"]
    assert not reload["ok"]
    (error,) = reload["errors"]
    assert re.match(r".*cairnq\.yaml:\d+:\d+: aliases expand to more than 10000 nodes", error)
    assert_the_loop_runs(daemon)
    assert daemon.stop() == 0


def unblock(path: Path, text: str) -> None:
    """Feed a reader still blocked on the FIFO (if any), then put a file back."""
    with contextlib.suppress(OSError):  # ENXIO: nobody is reading
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        with open(fd, "w") as fifo:
            fifo.write(text)
    path.unlink()
    path.write_text(text)


def test_reload_of_a_config_that_no_longer_parses_reaches_the_daemon(
    tmp_path: Path, sqlite_path: str, daemon_factory: Any
) -> None:
    """Whatever the file says now, `reload` finds the daemon that runs it, and the
    daemon itself says what is wrong with the file, where, and keeps running."""
    config = config_for(tmp_path, sqlite_path, {"g": {"queues": ["q"], "processes": 1}})
    daemon = daemon_factory(config).start()
    before = set(daemon.children("g"))
    good = daemon.config_path.read_text()
    daemon.config_path.write_text(good + "groups_extra: [1, 2\n")
    done = daemon.cli("reload", "--wait", "30s")
    assert done.returncode == 78, (done.stdout, done.stderr)
    assert "no cairnqd running" not in done.stderr
    assert re.search(r"cairnq\.yaml:\d+:\d+: ", done.stderr), done.stderr
    assert f"reload refused; still running generation 1 (pid {daemon.pid})" in done.stderr
    # A file that parses but names another runtime_dir: the daemon still gets it, and
    # refuses what only a restart can change.
    config["runtime_dir"] = str(tmp_path / "elsewhere")
    daemon.write_config(config)
    done = daemon.cli("reload", "--wait", "30s")
    assert done.returncode == 78, (done.stdout, done.stderr)
    assert "runtime_dir changed: needs a restart" in done.stderr
    status = daemon.cli("status")  # asks the daemon over its socket, found the same way
    assert status.returncode == 0, status.stderr
    assert set(daemon.children("g")) == before
    daemon.config_path.write_text(good)
    done = daemon.cli("reload", "--wait", "30s")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert daemon.stop() == 0
