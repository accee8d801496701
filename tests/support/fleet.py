"""A fleet registry row built in memory, for tests of what reads the fleet."""

from __future__ import annotations

from typing import Any

from cairnqd.store.tables.fleet import FleetMember


def fleet_member(daemon: str, version: str, **fields: Any) -> FleetMember:
    """A live daemon's row; `fields` override any other column."""
    values: dict[str, Any] = {
        "daemon": daemon,
        "host": "h",
        "pid": 1,
        "config": "/etc/cairnq.yaml",
        "version": version,
        "pipe_protocol": 2,
        "features": ("fleet", "pauses"),
        "groups": ("default",),
        "started_at_ms": 0,
        "seen_at_ms": 0,
        "stopped_at_ms": None,
        "age_ms": 3000,
        "live": True,
    }
    return FleetMember(**{**values, **fields})
