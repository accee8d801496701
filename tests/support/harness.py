"""What the daemon suites share: configs, and ways to look at a daemon from outside.

`daemon_config` builds a validated in-process `Config` (for Metrics and Maintenance
under test), `control_config` the document of a daemon that operator commands run
beside; the rest talks to a running daemon the way an operator would: a client on
the same database, and a scrape of its /metrics text.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

from cairnqd import CairnQ
from cairnqd.config import Config, load_config
from tests.support.daemon import base_config
from tests.support.databases import make_store
from tests.support.waiting import wait_for


def daemon_config(tmp_path: Path, dialect: str, target: str, **sections: Any) -> Config:
    """A validated config for `target` (SQLite path or Postgres DSN), sections overridden."""
    database = {"path": target} if dialect == "sqlite" else {"dsn": target}
    document: dict[str, Any] = {
        "version": 1,
        "database": database,
        "handlers": ["cairnqd.demo:registry"],
        "groups": {"default": {"queues": ["default", "email"], "processes": 2}},
        "metrics": {"listen": "127.0.0.1:0", "stats_ttl": "0s"},
        **sections,
    }
    path = tmp_path / "cairnq.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_config(path, {})


def database_section(dialect: str, target: str) -> dict[str, Any]:
    """The `database:` section of a daemon config for a fresh test database."""
    # Fresh test databases: let the daemon migrate them (Postgres defaults to off).
    if dialect == "sqlite":
        return {"path": target}
    return {"dsn": target, "auto_migrate": True}


def control_config(
    tmp_path: Path, dialect: str, target: str, groups: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """A daemon config on `target` with quick heartbeats, so status views fill fast."""
    config = base_config(tmp_path, database_section(dialect, target), groups)
    config["metrics"] = {"listen": "127.0.0.1:0", "stats_ttl": "0s"}
    config.update(extra)
    return config


async def _with_client(
    dialect: str, target: str, action: Callable[[CairnQ], Awaitable[Any]]
) -> Any:
    client = CairnQ(make_store(dialect, target))
    await client.connect()
    try:
        return await action(client)
    finally:
        await client.close()


def client_call(dialect: str, target: str, action: Callable[[CairnQ], Awaitable[Any]]) -> Any:
    """Run `action(client)` on a fresh client of the daemon's database, from sync code."""
    return asyncio.run(_with_client(dialect, target, action))


def stats(dialect: str, target: str, queue: str | None = None) -> dict[str, dict[str, int]]:
    return client_call(dialect, target, lambda c: c.stats(queue))  # type: ignore[no-any-return]


def wait_running(dialect: str, target: str, task_id: str) -> Any:
    """Wait for the task to be running; return it as read then."""

    def running() -> Any:
        task = client_call(dialect, target, lambda c: c.get(task_id))
        return task if task.status == "running" else None

    return wait_for("the task to start", running, timeout=60)


def scrape(port: int) -> str:
    """The /metrics text of the daemon listening on `port`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


def gauge(text: str, name: str, **labels: str) -> float | None:
    """The value of the first `name` sample in `text` carrying `labels`, if any."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None
