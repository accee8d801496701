"""`cairnqd limits`, `limits set` and `limits reset`: what each limit holds, read from
the database; an operator's change reaching every child of a running daemon within a
second; and a reload of the config ending it. Both dialects."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from cairnqd.limits import parse_limits
from tests.support.cli import cli
from tests.support.daemon import write_config
from tests.support.databases import make_store
from tests.support.executions import executions
from tests.support.harness import client_call, control_config
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

LIMITS = {
    "smtp": {"queues": ["a"], "concurrency": 3, "rate": "10/1m"},
    "tenant": {"queues": ["b"], "concurrency": 1, "partition_by": "payload.t"},
}


def _hold(dialect: str, target: str) -> None:
    """Claim what the limits allow, as a worker would, and keep it running."""

    async def act() -> None:
        store = make_store(dialect, target)
        await store.connect()
        try:
            for i in range(5):
                await store.submit(name="n", queue="a", payload={"i": i})
            for t in ["x", "x", "y"]:
                await store.submit(name="n", queue="b", payload={"t": t})
            store.use_limits(parse_limits(LIMITS))
            await store.claim(queues=["a", "b"], worker_id="w", limit=10, lease_ms=600_000)
        finally:
            await store.close()

    asyncio.run(act())


def test_limits_shows_use_and_set_and_reset_change_it(
    tmp_path: Path, dialect: str, db_target: str
) -> None:
    config = control_config(tmp_path, dialect, db_target, {"g": {"queues": ["a", "b"]}})
    config["limits"] = LIMITS
    path = write_config(tmp_path, config)
    assert cli(path, "migrate").returncode == 0
    _hold(dialect, db_target)

    shown = cli(path, "limits")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split()[:5] == ["LIMIT", "PARTITION", "RUNNING", "STARTS", "WAITING"]
    assert lines[1].split()[:6] == ["smtp", "-", "3/3", "3/10", "per", "1m"]
    assert lines[1].split()[6] == "2"
    assert lines[2].split()[:5] == ["tenant", "x", "1/1", "-", "1"]
    assert lines[3].split()[:5] == ["tenant", "y", "1/1", "-", "0"]

    data = json.loads(cli(path, "limits", "--json").stdout)["limits"]
    smtp = next(d for d in data if d["name"] == "smtp")
    assert (smtp["in_use"], smtp["waiting"], smtp["override"]) == (3, 2, None)
    assert smtp["rate"] == {"count": 10, "window_ms": 60_000}

    changed = cli(path, "limits", "set", "smtp", "--concurrency", "1", "--reason", "relay slow")
    assert changed.returncode == 0, changed.stderr
    assert "limit smtp: concurrency 3 -> 1 on every host" in changed.stdout
    data = json.loads(cli(path, "limits", "--json").stdout)["limits"]
    smtp = next(d for d in data if d["name"] == "smtp")
    assert smtp["concurrency"] == 1 and smtp["override"]["reason"] == "relay slow"
    assert "smtp: set by " in cli(path, "limits").stdout

    refusals = [
        (("limits", "set", "nope", "--concurrency", "1"), 64, "no limit 'nope'"),
        (("limits", "set", "smtp"), 64, "give --concurrency N"),
        (("limits", "set", "smtp", "--concurrency", "0"), 64, "1 to 10000"),
        (("limits", "set", "tenant", "--rate", "5/1s"), 64, "tenant has no rate"),
        (("limits", "set", "smtp", "--rate", "lots"), 64, "--rate must be COUNT/DURATION"),
    ]
    for args, code, said in refusals:
        refused = cli(path, *args)
        assert (refused.returncode, said in refused.stderr) == (code, True), refused.stderr

    reset = cli(path, "limits", "reset", "smtp")
    assert reset.returncode == 0 and "limit smtp: back to the config" in reset.stdout
    again = cli(path, "limits", "reset", "smtp")
    assert again.returncode == 1 and "not overridden: smtp" in again.stderr


def test_an_override_reaches_the_children_and_a_reload_ends_it(
    tmp_path: Path, dialect: str, db_target: str, daemon_factory: Any
) -> None:
    groups = {"g": {"queues": ["a"], "processes": 2, "concurrency": 4, "prefetch": 0}}
    config = control_config(tmp_path, dialect, db_target, groups)
    config["handlers"] = ["tests.daemon.fault_handlers:registry"]
    config["limits"] = {"smtp": {"queues": ["a"], "concurrency": 3}}
    daemon = daemon_factory(config).start()
    changed = daemon.cli("limits", "set", "smtp", "--concurrency", "1")
    assert changed.returncode == 0, changed.stderr
    # No wait needed: a child reads the overrides inside its first claim (and again at
    # most every half second), before it takes any room.
    log = tmp_path / "runs.log"

    async def submit(client: CairnQ) -> list[str]:
        payload = {"log": str(log), "seconds": 0.1}
        return [(await client.submit("f.quick", payload, queue="a")).id for _ in range(8)]

    ids = client_call(dialect, db_target, submit)

    def done() -> bool:
        async def read(client: CairnQ) -> bool:
            tasks = [await client.get(i) for i in ids]
            return all(t is not None and t.status == "succeeded" for t in tasks)

        return bool(client_call(dialect, db_target, read))

    wait_for("every task to succeed", done, timeout=60)
    runs = executions(log)
    events = sorted([(r.started, 1) for r in runs] + [(r.ended or 0.0, -1) for r in runs])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    assert most == 1
    assert "limit smtp: overridden by" in daemon.output()

    reloaded = daemon.cli("reload", "--wait", "60s")
    assert reloaded.returncode == 0, reloaded.stderr

    def override() -> Any:
        limits = json.loads(daemon.cli("limits", "--json").stdout)["limits"]
        return limits[0]["override"]

    wait_for("the reload to end the override", lambda: override() is None, timeout=30)
    assert daemon.stop() == 0


def test_inspect_says_which_limit_a_due_task_waits_for(
    tmp_path: Path, dialect: str, db_target: str
) -> None:
    config = control_config(tmp_path, dialect, db_target, {"g": {"queues": ["a", "b"]}})
    config["limits"] = LIMITS
    path = write_config(tmp_path, config)
    assert cli(path, "migrate").returncode == 0
    _hold(dialect, db_target)
    queued = json.loads(cli(path, "list", "--status", "queued", "--json").stdout)
    running = json.loads(cli(path, "list", "--status", "running", "--json").stdout)
    mail = next(t["id"] for t in queued if t["queue"] == "a")
    tenant = next(t["id"] for t in queued if t["queue"] == "b")

    shown = cli(path, "inspect", mail)
    assert shown.returncode == 0, shown.stderr
    assert "waiting for room in limit smtp: 3/3 running" in shown.stdout.splitlines()
    data = json.loads(cli(path, "inspect", mail, "--json").stdout)
    assert data["waiting_for"] == [
        {
            "limit": "smtp",
            "partition": "(none)",
            "kind": "concurrency",
            "in_use": 3,
            "capacity": 3,
            "opens_in_ms": None,
        }
    ]
    partitioned = cli(path, "inspect", tenant).stdout
    assert "waiting for room in limit tenant (partition x): 1/1 running" in partitioned
    busy = json.loads(cli(path, "inspect", running[0]["id"], "--json").stdout)
    assert busy["waiting_for"] == []

    # Room for more (an operator's change): nothing holds the task back any more.
    assert cli(path, "limits", "set", "smtp", "--concurrency", "5").returncode == 0
    assert json.loads(cli(path, "inspect", mail, "--json").stdout)["waiting_for"] == []
    assert "waiting for room" not in cli(path, "inspect", mail).stdout
