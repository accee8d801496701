"""Schedules run by real daemons: two daemons on one Postgres with the leader SIGKILLed
halfway, a SQLite daemon killed and restarted, reloads that add, remove and refuse
schedules under load, and `cairnqd schedules` against them. Tasks are counted per slot
in the database."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cairnqd.store.tables.schedules import ScheduleRow, ScheduleTable
from tests.support.daemon import Daemon, base_config
from tests.support.databases import make_store
from tests.support.harness import database_section
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

#: The takeover bound we promise (docs/schedules.md): the follower asks every second.
TAKEOVER_BOUND_S = 5.0


def config(tmp: Path, dialect: str, target: str, **schedules: Any) -> dict[str, Any]:
    document = base_config(
        tmp, database_section(dialect, target), {"default": {"queues": ["default"]}}
    )
    document["schedules"] = schedules
    return document


def tick(misfire: Any, **extra: Any) -> dict[str, Any]:
    return {"name": "t.echo", "every": "1s", "misfire": misfire, **extra}


def daemon_in(tmp: Path, document: dict[str, Any]) -> Daemon:
    tmp.mkdir(parents=True, exist_ok=True)
    document = {**document, "runtime_dir": str(tmp / "run")}
    return Daemon(tmp, document)


async def _slots(dialect: str, target: str) -> tuple[dict[str, Counter[str]], dict[str, Any]]:
    async with make_store(dialect, target) as store:
        tasks = await store.list(name="t.echo", limit=100_000)
        rows = await ScheduleTable(store).rows()
    by_schedule: dict[str, Counter[str]] = {}
    for task in tasks:
        if "slot" in task.metadata:
            by_schedule.setdefault(task.metadata["schedule"], Counter())[task.metadata["slot"]] += 1
    return by_schedule, rows


def slots(dialect: str, target: str, schedule: str = "tick") -> Counter[str]:
    return asyncio.run(_slots(dialect, target))[0].get(schedule, Counter())


def rows(dialect: str, target: str) -> dict[str, ScheduleRow]:
    found: dict[str, ScheduleRow] = asyncio.run(_slots(dialect, target))[1]
    return found


def parse(slot: str) -> datetime:
    return datetime.fromisoformat(slot.replace("Z", "+00:00"))


def missing_seconds(enqueued: Counter[str]) -> list[datetime]:
    """Whole seconds between the first and last slot that have no task."""
    times = sorted(parse(s) for s in enqueued)
    have = set(times)
    gaps, t = [], times[0]
    while t < times[-1]:
        if t not in have:
            gaps.append(t)
        t += timedelta(seconds=1)
    return gaps


def leads(daemon: Daemon) -> bool:
    return "now runs the schedules" in daemon.output()


def wait_for_slots(dialect: str, target: str, n: int, timeout: float = 60.0) -> Counter[str]:
    return wait_for(
        f"{n} slots enqueued",
        lambda: found if len(found := slots(dialect, target)) >= n else None,
        timeout,
    )


@pytest.mark.timing
@pytest.mark.postgres
def test_two_daemons_on_postgres_enqueue_each_slot_once_across_a_sigkill(
    pg_dsn: str, tmp_path: Path
) -> None:
    # catch_up 30: the slots of the takeover are enqueued late, not lost.
    document = config(tmp_path, "postgres", pg_dsn, tick=tick({"catch_up": 30}))
    first = daemon_in(tmp_path / "a", document).start()
    second = None
    try:
        wait_for("the first daemon leads", lambda: leads(first), 30)
        second = daemon_in(tmp_path / "b", document).start()
        before = wait_for_slots("postgres", pg_dsn, 12)
        assert not leads(second)
        killed_at = time.time()
        first.signal(signal.SIGKILL)
        wait_for("the second daemon leads", lambda: leads(second), TAKEOVER_BOUND_S * 3)
        took_over_s = time.time() - killed_at
        assert took_over_s <= TAKEOVER_BOUND_S, took_over_s
        enqueued = wait_for_slots("postgres", pg_dsn, len(before) + 12)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    enqueued = slots("postgres", pg_dsn)
    doubled = {slot: n for slot, n in enqueued.items() if n != 1}
    assert doubled == {}  # none doubled
    assert missing_seconds(enqueued) == []  # none lost: catch_up covered the takeover
    assert len(enqueued) >= 24
    row = rows("postgres", pg_dsn)["tick"]
    assert row.misfires == 0
    assert row.fired_by is not None and str(second.pid) in row.fired_by


def test_sqlite_daemon_killed_and_restarted_skips_the_downtime_once(
    sqlite_path: str, tmp_path: Path
) -> None:
    document = config(tmp_path, "sqlite", sqlite_path, tick=tick("skip"))
    first = daemon_in(tmp_path / "a", document).start()
    try:
        before = wait_for_slots("sqlite", sqlite_path, 4)
        first.signal(signal.SIGKILL)
        down_at = time.time()
        first.proc.wait(30)  # type: ignore[union-attr]
        # A downtime of a few whole slots (time passing, not a synchronisation).
        wait_for("3 s of downtime", lambda: time.time() - down_at >= 3.0 or None, 10)
    finally:
        first.stop()
    second = daemon_in(tmp_path / "b", document).start()
    try:
        wait_for_slots("sqlite", sqlite_path, len(before) + 4)
    finally:
        second.stop()
    enqueued = slots("sqlite", sqlite_path)
    assert set(enqueued.values()) == {1}  # none doubled across the restart
    gaps = missing_seconds(enqueued)
    row = rows("sqlite", sqlite_path)["tick"]
    # skip: the downtime's slots were given up and counted, nothing else is missing.
    assert len(gaps) >= 2 and row.misfires == len(gaps)
    assert {g.timestamp() for g in gaps} <= set(range(int(down_at) - 1, int(time.time())))


def test_reload_adds_removes_and_refuses_schedules_under_load(
    sqlite_path: str, tmp_path: Path
) -> None:
    home = tmp_path / "d"  # the daemon's directory: every config below names its run dir
    original = config(home, "sqlite", sqlite_path, old=tick("skip", payload={"s": "old"}))
    daemon = daemon_in(home, original).start()
    try:
        asyncio.run(_load(sqlite_path, 300))
        wait_for("old fires", lambda: len(slots("sqlite", sqlite_path, "old")) >= 2 or None)

        # Reload: `new` added, `old` removed, while the load is being worked off.
        daemon.write_config(config(home, "sqlite", sqlite_path, new=tick("skip")))
        reload = daemon.cli("reload", "--wait", "30s")
        assert reload.returncode == 0, reload.stderr
        reloaded_at = time.time()
        wait_for("new fires", lambda: len(slots("sqlite", sqlite_path, "new")) >= 3 or None)
        last_old = max(parse(s) for s in slots("sqlite", sqlite_path, "old"))
        assert last_old.timestamp() <= reloaded_at + 1.0  # at most the slot in flight

        # `cairnqd schedules`: only the configured schedule, its next slots, its last run.
        listed = daemon.cli("schedules", "--json")
        assert listed.returncode == 0, listed.stderr
        data = json.loads(listed.stdout)
        (entry,) = data["schedules"]
        assert entry["schedule"] == "new" and entry["rule"] == "every 1s"
        assert len(entry["next"]) == 3 and entry["next"] == sorted(entry["next"])
        assert parse(entry["next"][0]).timestamp() > time.time() - 2
        assert entry["last_run"]["slot"] is not None
        assert entry["last_run"]["result"] in {"queued", "running", "succeeded"}
        assert data["leader"]["host"].endswith(f"/{daemon.pid}")
        text = daemon.cli("schedules").stdout
        assert "new: t.echo on default, every 1s, misfire skip" in text
        assert re.search(r"last run:\s+\S+ \(slot \S+\) by \S+", text), text

        # A manual run: one more task, recorded as the last run, no slot claimed.
        manual = daemon.cli("schedules", "run", "new")
        assert manual.returncode == 0, manual.stderr
        task_id = manual.stdout.split()[0]
        shown = json.loads(daemon.cli("schedules", "--json").stdout)["schedules"][0]
        if shown["last_run"]["slot"] is None:  # unless a slot fired since
            assert shown["last_run"]["task_id"] == task_id
        unknown = daemon.cli("schedules", "run", "nope")
        assert unknown.returncode == 64 and "no schedule 'nope'" in unknown.stderr

        # A broken schedule: refused with file:line:col, and `new` keeps firing.
        broken = config(home, "sqlite", sqlite_path, new=tick("skip", cron="0 0 30 2 *"))
        del broken["schedules"]["new"]["every"]
        daemon.write_config(broken)
        refused = daemon.cli("reload", "--wait", "30s")
        assert refused.returncode != 0
        pattern = r"cairnq\.yaml:\d+:\d+: schedules\.new\.cron: '0 0 30 2 \*': never fires"
        assert re.search(pattern, refused.stderr + refused.stdout), refused.stderr
        count = len(slots("sqlite", sqlite_path, "new"))
        wait_for("new still fires", lambda: len(slots("sqlite", sqlite_path, "new")) >= count + 2)
    finally:
        daemon.stop()
    assert set(slots("sqlite", sqlite_path, "new").values()) == {1}
    assert os.path.exists(sqlite_path)


async def _load(target: str, n: int) -> None:
    async with make_store("sqlite", target) as store:
        await store.submit_many(
            [{"name": "t.sleep", "payload": {"seconds": 0.05}} for _ in range(n)]
        )
