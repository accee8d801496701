"""`LimitTable`: what the flow-control limits hold now (`cairnqd limits`, the metrics)
and the operator's overrides (`cairnqd limits set`), in cairnqd's own tables
(`cairnqd_limit_slots`, `cairnqd_limit_overrides`); the claim itself lives in
store/limits.py."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cairnqd.limits import NO_PARTITION, Limit, Override, Rate, like_pattern
from cairnqd.store.arguments import require_str
from cairnqd.store.executor import Executor
from cairnqd.store.operator import check_reason


@dataclass(frozen=True)
class PartitionUsage:
    """One partition of a limit now: concurrency slots held by running claims, starts
    in the rate window, due tasks waiting, and when the rate window next opens."""

    part: str
    in_use: int = 0
    starts: int = 0
    waiting: int = 0
    #: Milliseconds until the earliest start leaves the window; None: no start in it.
    window_frees_in_ms: int | None = None


@dataclass(frozen=True)
class LimitUsage:
    limit: Limit
    partitions: tuple[PartitionUsage, ...] = field(default_factory=tuple)

    @property
    def in_use(self) -> int:
        return sum(p.in_use for p in self.partitions)

    @property
    def waiting(self) -> int:
        return sum(p.waiting for p in self.partitions)

    def to_json(self) -> dict[str, Any]:
        lim = self.limit
        return {
            "name": lim.name,
            "queues": list(lim.queues),
            "names": list(lim.names),
            "concurrency": lim.concurrency,
            "rate": None if lim.rate is None else dataclasses.asdict(lim.rate),
            "partition_by": lim.partition_field,
            "in_use": self.in_use,
            "waiting": self.waiting,
            "partitions": [dataclasses.asdict(p) for p in self.partitions],
        }


@dataclass(frozen=True)
class Bypass:
    """A running task a limit covers that does not count in it, and who claimed it."""

    limit: str
    task_id: str
    name: str
    worker_id: str

    def describe(self) -> str:
        return (
            f"limit {self.limit}: task {self.task_id} ({self.name}) runs outside it, "
            f"claimed by worker {self.worker_id}, which does not keep this limit "
            "(a public SDK worker, or a cairnqd worker configured without it)"
        )


class LimitTable:
    def __init__(self, executor: Executor) -> None:
        self._db = executor

    async def usage(self, limits: Sequence[Limit]) -> list[LimitUsage]:
        """Each limit's partitions as they stand (those with anything held or waiting)."""
        out = []
        for limit in limits:
            parts: dict[str, dict[str, Any]] = defaultdict(dict)
            rows = await self._db.fetch("extensions/limit_usage", {"limit_name": limit.name})
            for row in rows:
                part = parts[str(row["part"])]
                if row["kind"] == "concurrency":
                    part["in_use"] = int(row["used"] or 0)
                else:
                    part["starts"] = int(row["used"] or 0)
                    if row["frees_at_ms"] is not None:
                        frees = int(row["frees_at_ms"]) - int(row["now_ms"])
                        part["window_frees_in_ms"] = max(0, frees)
            for row in await self._db.fetch("extensions/limit_waiting", self._cover(limit)):
                parts[str(row["part"])]["waiting"] = int(row["waiting"])
            shown = [
                PartitionUsage(part=name, **values)
                for name, values in sorted(parts.items())
                if any(values.get(k) for k in ("in_use", "starts", "waiting"))
            ]
            out.append(LimitUsage(limit, tuple(shown)))
        return out

    def _cover(self, limit: Limit) -> dict[str, Any]:
        postgres = self._db.dialect == "postgres"
        path: Any = None
        if limit.partition_by is not None:
            path = list(limit.partition_by) if postgres else "$." + ".".join(limit.partition_by)
        globs = [like_pattern(g) for g in limit.names] if postgres else list(limit.names)
        return {"queues": list(limit.queues), "globs": globs, "path": path}

    async def bypassing(self, limits: Sequence[Limit], *, most: int = 20) -> list[Bypass]:
        """Running tasks that a concurrency limit covers but whose claim holds none of
        its room: claimed by a worker that does not know the limit (docs/limits.md,
        "What stays outside the guarantee"). At most `most` per limit, oldest first."""
        found = []
        for limit in limits:
            if limit.concurrency is None:
                continue  # a rate slot is reused once its window passes: no record left
            params = {**self._cover(limit), "limit_name": limit.name, "limit": most}
            for row in await self._db.fetch("extensions/limit_bypass", params):
                found.append(
                    Bypass(limit.name, str(row["id"]), str(row["name"]), str(row["worker_id"]))
                )
        return found

    async def overrides(self) -> list[Override]:
        rows = await self._db.fetch("extensions/limit_overrides", {})
        return [Override.from_row(r) for r in rows]

    async def set(
        self,
        name: str,
        *,
        concurrency: int | None,
        rate: Rate | None,
        set_by: str,
        reason: str | None = None,
    ) -> Override:
        """Override limit `name` for every worker on the database until a reload."""
        require_str(name, "name")
        require_str(set_by, "set_by")
        if concurrency is None and rate is None:
            raise ValueError("set concurrency, rate, or both")
        params = {
            "limit_name": name,
            "concurrency": concurrency,
            "rate_count": None if rate is None else rate.count,
            "rate_window_ms": None if rate is None else rate.window_ms,
            "set_by": set_by,
            "reason": check_reason(reason),
        }
        (row,) = await self._db.fetch("extensions/limit_override_set", params)
        return Override.from_row(row)

    async def clear(self, names: Sequence[str]) -> list[str]:
        """Drop the overrides of `names`; the names that had one."""
        if not names:
            return []
        rows = await self._db.fetch("extensions/limit_overrides_clear", {"names": list(names)})
        return sorted(str(r["limit_name"]) for r in rows)


__all__ = ["NO_PARTITION", "Bypass", "LimitTable", "LimitUsage", "PartitionUsage"]
