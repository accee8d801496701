"""The daemon's SQLite file deleted or replaced under it.

A connection holds the file's inode, not its path: the daemon's processes would go on
working on an orphaned inode while anything opening the path got another database (or
created an empty one). The daemon must notice within seconds, say so once (CRITICAL),
report unhealthy, stop claiming, and never create or migrate a fresh file itself.

To see whether the children still claim, the test keeps a client open on the original
file from before the fault: its submits land in the orphaned inode, where only the
daemon's children can see them.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from cairnqd.store.sqlite import SQLiteStore
from tests.support.daemon import Daemon, base_config, healthz
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

HANDLERS = ["tests.daemon.fault_handlers:registry"]
DETECTION_BOUND_S = 15.0
CRITICAL = "CRITICAL"

DaemonFactory = Callable[[dict[str, Any]], Daemon]


class HeldClient:
    """A client on its own loop in this thread, kept open across the fault."""

    def __init__(self, path: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = CairnQ(SQLiteStore(path))
        self.loop.run_until_complete(self.client.connect())

    def submit(self, count: int) -> list[str]:
        async def go() -> list[str]:
            tasks = await self.client.submit_many([{"name": "f.quick", "payload": {}}] * count)
            return [t.id for t in tasks]

        return self.loop.run_until_complete(go())

    def statuses(self, ids: list[str]) -> list[str]:
        async def go() -> list[str]:
            found = [await self.client.get(i) for i in ids]
            return [t.status if t is not None else "missing" for t in found]

        return self.loop.run_until_complete(go())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


@pytest.fixture
def daemon(daemon_factory: DaemonFactory, tmp_path: Path) -> Daemon:
    config = base_config(
        tmp_path,
        {"path": str(tmp_path / "tasks.db")},
        {"default": {"queues": ["default"], "processes": 2, "concurrency": 2}},
    )
    config["handlers"] = HANDLERS
    started = daemon_factory(config).start()
    wait_for("both children ready", lambda: len(started.children()) == 2, timeout=60)
    return started


@pytest.fixture
def held(tmp_path: Path, daemon: Daemon) -> Iterator[HeldClient]:
    client = HeldClient(str(tmp_path / "tasks.db"))
    try:
        yield client
    finally:
        client.close()


def critical_lines(daemon: Daemon) -> list[str]:
    return [line for line in daemon.output().splitlines() if f" {CRITICAL} " in line]


def quiet_children(daemon: Daemon) -> list[str]:
    return [title for title in daemon.children().values() if title.endswith("quiet")]


def assert_detected(daemon: Daemon, held: HeldClient, path: Path, how: str) -> None:
    port = daemon.metrics_port()
    lines = wait_for("the CRITICAL line", lambda: critical_lines(daemon), DETECTION_BOUND_S)
    assert how in lines[0] and str(path) in lines[0], lines
    _, body = wait_for(
        "/healthz to fail", lambda: healthz(port), DETECTION_BOUND_S, accept=lambda r: r[0] == 503
    )
    assert any(how in problem for problem in body["problems"]), body
    wait_for("both children to stop claiming", lambda: len(quiet_children(daemon)) == 2)
    # Work that reaches the old file now is not claimed: nobody else would ever see it.
    ids = held.submit(5)
    stays("the new tasks queued", lambda: held.statuses(ids) == ["queued"] * 5, seconds=4)
    # Said once, not once per check or per process.
    assert len(critical_lines(daemon)) == 1, daemon.output()


def stays(what: str, observe: Callable[[], bool], seconds: float) -> None:
    """`observe()` holds at every poll for `seconds` (the pause only paces the polls)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert observe(), f"{what} stopped holding"
        time.sleep(0.1)


def test_deleting_the_file_is_detected_and_nothing_recreates_it(
    daemon: Daemon, held: HeldClient, tmp_path: Path
) -> None:
    path = tmp_path / "tasks.db"
    before = held.submit(10)
    wait_for("the first tasks to run", lambda: held.statuses(before) == ["succeeded"] * 10)

    path.unlink()
    assert_detected(daemon, held, path, "deleted")
    # The parent neither created nor migrated a fresh file at the path.
    assert not path.exists()
    assert len(daemon.children()) == 2


def test_replacing_the_file_is_detected(daemon: Daemon, held: HeldClient, tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    other = tmp_path / "other.db"

    async def make_other() -> None:
        async with CairnQ(SQLiteStore(str(other))) as client:
            await client.submit("f.quick", {})

    asyncio.run(make_other())
    for suffix in ("-wal", "-shm"):
        Path(f"{other}{suffix}").unlink(missing_ok=True)
    replacement = os.stat(other).st_ino
    os.rename(other, path)
    assert_detected(daemon, held, path, "replaced")
    # Left as the operator put it: the parent did not migrate or rewrite it.
    assert os.stat(path).st_ino == replacement


# -- the pieces, without a daemon ------------------------------------------------------------


def test_an_existing_file_uri_never_creates_the_file(tmp_path: Path) -> None:
    import sqlite3

    from cairnqd.store.sqlite.files import ensure_file, existing_file_uri

    path = tmp_path / "odd ?#% name.db"
    with pytest.raises(sqlite3.OperationalError, match="unable to open"):
        sqlite3.connect(existing_file_uri(str(path)), uri=True).execute("select 1")
    assert not path.exists()
    assert ensure_file(str(path)) and not ensure_file(str(path))
    assert os.stat(path).st_mode & 0o777 == 0o600 & ~_umask()
    sqlite3.connect(existing_file_uri(str(path)), uri=True).execute("create table t (x)")
    assert existing_file_uri(":memory:") == ":memory:"


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_the_file_watch_tells_deleted_from_replaced(tmp_path: Path) -> None:
    from cairnqd.store.sqlite.files import DatabaseFile

    path = tmp_path / "a.db"
    path.write_bytes(b"")
    watch = DatabaseFile(str(path))
    assert watch.check() is None  # nothing remembered yet: nothing to compare
    watch.remember()
    assert watch.check() is None
    other = tmp_path / "b.db"
    other.write_bytes(b"")
    os.rename(other, path)
    lost = watch.check()
    assert lost is not None and "replaced" in lost
    path.unlink()
    assert watch.check() == lost  # the first finding stands
    gone = DatabaseFile(str(tmp_path / "c.db"))
    (tmp_path / "c.db").write_bytes(b"")
    gone.remember()
    (tmp_path / "c.db").unlink()
    assert "deleted" in (gone.check() or "")


def test_maintenance_stops_its_duties_on_a_lost_file_without_spinning(tmp_path: Path) -> None:
    from cairnqd.daemon.parent.maintenance import Maintenance
    from cairnqd.daemon.parent.metrics import Metrics
    from cairnqd.store.sqlite.files import ensure_file, remember_file
    from tests.support.harness import daemon_config

    path = tmp_path / "tasks.db"
    ensure_file(str(path))
    remember_file(str(path))  # as the supervisor does at start
    config = daemon_config(tmp_path, "sqlite", str(path))
    metrics = Metrics(config)
    maintenance = Maintenance(config, metrics)
    maintenance.start()
    try:
        # (Deleted before or after the first probe: found either way.)
        path.unlink()
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        problem = wait_for("the loss", maintenance.database_problem, timeout=10)
        assert problem is not None and "deleted" in problem and str(path) in problem
        cpu = time.process_time()
        stays("the file gone", lambda: not path.exists(), seconds=2)
        # Waiting, not spinning: a loop on the lost file would take a whole core.
        assert time.process_time() - cpu < 1.0
        assert maintenance.stop(10)
    finally:
        maintenance.stop(10)
        metrics.close()
    assert not path.exists()  # closing did not recreate it either


def test_a_duty_failing_on_a_deleted_file_reports_the_loss_not_an_outage(
    tmp_path: Path,
) -> None:
    """The race the test above once lost in CI: the reaper's statement ran as the file
    went and failed with "disk I/O error" before the next identity check, so /healthz
    said "database unreachable" instead of naming the deleted file."""
    import asyncio
    import sqlite3

    from cairnqd.daemon.parent.maintenance import Maintenance
    from cairnqd.daemon.parent.metrics import Metrics
    from cairnqd.store.sqlite.files import ensure_file, remember_file
    from tests.support.harness import daemon_config

    path = tmp_path / "tasks.db"
    ensure_file(str(path))
    remember_file(str(path))
    config = daemon_config(tmp_path, "sqlite", str(path))
    metrics = Metrics(config)
    maintenance = Maintenance(config, metrics)
    try:
        # Started to take note of the file, as the daemon does; stopped, so that the one
        # duty below runs here, alone.
        maintenance.start()
        assert maintenance.stop(10)
        path.unlink()

        async def reaper_on_the_lost_file() -> None:
            raise sqlite3.OperationalError("disk I/O error")

        asyncio.run(maintenance._tick("reaper", reaper_on_the_lost_file))
        problem = maintenance.database_problem()
        assert problem is not None and "deleted" in problem and str(path) in problem, problem
        assert maintenance.database_down_s() == 0.0  # not counted as an outage
    finally:
        metrics.close()
