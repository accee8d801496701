"""`FleetRegistry`: the daemons on this database (`cairnqd_fleet`), each with its version
and the fleet-wide features it honours (`cairnqd_features`), so an operator sees the
fleet and an action that needs every daemon can tell who would ignore it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cairnqd.store.arguments import require_duration, require_int, require_str
from cairnqd.store.executor import Executor

#: The fleet-wide features this code honours, each named as `cairnqd_features` names
#: it: a daemon that runs this code advertises them all.
HONOURED_FEATURES: tuple[str, ...] = (
    "attempts",
    "fleet",
    "limit_counts",
    "limits",
    "pauses",
    "schedules",
)
#: A daemon stamps its row this often...
BEAT_S = 5.0
#: ...and counts as gone once its stamp is older than this (a stop says so at once).
LIVE_MS = 20_000
#: Rows of daemons stopped or silent this long are forgotten.
FORGET_MS = 86_400_000


@dataclass(frozen=True)
class FleetMember:
    """One daemon's row: who it is, what it runs, and whether it is live now."""

    daemon: str
    host: str
    pid: int
    config: str
    version: str
    pipe_protocol: int
    features: tuple[str, ...]
    groups: tuple[str, ...]
    started_at_ms: int
    seen_at_ms: int
    stopped_at_ms: int | None
    age_ms: int = 0
    live: bool = True

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> FleetMember:
        return cls(
            daemon=str(row["daemon"]),
            host=str(row["host"]),
            pid=int(row["pid"]),
            config=str(row["config"]),
            version=str(row["version"]),
            pipe_protocol=int(row["pipe_protocol"]),
            features=_names(row["features"]),
            groups=_names(row["groups"]),
            started_at_ms=int(row["started_at_ms"]),
            seen_at_ms=int(row["seen_at_ms"]),
            stopped_at_ms=None if row["stopped_at_ms"] is None else int(row["stopped_at_ms"]),
            age_ms=int(row["age_ms"]),
            live=bool(row["live"]),
        )

    def to_json(self) -> dict[str, Any]:
        """Every field, as `cairnqd fleet --json` prints it (tuples become lists)."""
        return dataclasses.asdict(self)


def _names(text: object) -> tuple[str, ...]:
    """A JSON array of names as stored; anything else (a row another tool wrote) reads
    as no names rather than failing the listing."""
    try:
        value = json.loads(str(text))
    except ValueError:
        return ()
    if not isinstance(value, list):
        return ()
    return tuple(str(v) for v in value)


@dataclass(frozen=True)
class Feature:
    """A fleet-wide feature the database uses, and the migration that brought it."""

    name: str
    since: str


def lacking(members: Sequence[FleetMember], feature: str) -> list[FleetMember]:
    """The live daemons that do not honour `feature`."""
    return [m for m in members if m.live and feature not in m.features]


def versions(members: Sequence[FleetMember]) -> dict[str, int]:
    """Live daemons by version, most common first."""
    counts: dict[str, int] = {}
    for member in members:
        if member.live:
            counts[member.version] = counts.get(member.version, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


class FleetRegistry:
    def __init__(self, executor: Executor) -> None:
        self._db = executor

    async def join(
        self,
        daemon: str,
        *,
        host: str,
        pid: int,
        config: str,
        version: str,
        pipe_protocol: int,
        features: Sequence[str],
        groups: Sequence[str],
    ) -> None:
        """Write `daemon`'s row as it starts (taking over an earlier row of the same id)."""
        require_str(daemon, "daemon", max_bytes=255)
        require_str(host, "host")
        require_int(pid, "pid", minimum=0)
        require_str(version, "version")
        params = {
            "daemon": daemon,
            "host": host,
            "pid": pid,
            "config": config,
            "version": version,
            "pipe_protocol": pipe_protocol,
            "features": json.dumps(sorted(features)),
            "groups": json.dumps(list(groups)),
        }
        await self._db.fetch("extensions/fleet_join", params)

    async def beat(self, daemon: str, groups: Sequence[str]) -> bool:
        """Stamp `daemon`'s row; False when it has none any more (join again)."""
        rows = await self._db.fetch(
            "extensions/fleet_beat", {"daemon": daemon, "groups": json.dumps(list(groups))}
        )
        return bool(rows)

    async def leave(self, daemon: str) -> None:
        """Mark `daemon` stopped."""
        await self._db.fetch("extensions/fleet_leave", {"daemon": daemon})

    async def members(self, *, since_ms: int = 3_600_000) -> list[FleetMember]:
        """The daemons seen within `since_ms`, live or not, by host and pid."""
        require_duration(since_ms, "since_ms")
        rows = await self._db.fetch(
            "extensions/fleet_members", {"since_ms": since_ms, "live_ms": LIVE_MS}
        )
        return [FleetMember.from_row(r) for r in rows]

    async def live(self) -> list[FleetMember]:
        return [m for m in await self.members(since_ms=LIVE_MS) if m.live]

    async def prune(self, older_than_ms: int = FORGET_MS) -> int:
        """Forget daemons stopped or silent for `older_than_ms`; how many."""
        require_duration(older_than_ms, "older_than_ms")
        rows = await self._db.fetch("extensions/fleet_prune", {"older_than_ms": older_than_ms})
        return len(rows)

    async def features(self) -> list[Feature]:
        """The fleet-wide features this database uses."""
        rows = await self._db.fetch("extensions/fleet_features", {})
        return [Feature(str(r["feature"]), str(r["since"])) for r in rows]


__all__ = [
    "BEAT_S",
    "FORGET_MS",
    "HONOURED_FEATURES",
    "LIVE_MS",
    "Feature",
    "FleetMember",
    "FleetRegistry",
    "lacking",
    "versions",
]
