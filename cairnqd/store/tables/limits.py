"""`LimitTable`: what the flow-control limits hold now (`cairnqd limits`, the metrics,
the dashboard), why a due task waits for room (`cairnqd inspect`, the dashboard's task
page), and the operator's overrides (`cairnqd limits set`), in cairnqd's own tables
(`cairnqd_limit_slots`, `cairnqd_limit_overrides`); the claim itself lives in
store/limits.py."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from cairnqd.config.units import elapsed_text, format_duration
from cairnqd.limits import NO_PARTITION, Limit, Override, Rate, like_pattern, overridden
from cairnqd.store.arguments import require_str
from cairnqd.store.executor import Executor
from cairnqd.store.operator import check_reason

if TYPE_CHECKING:
    from cairnqd.models import Task

#: How long a claim seen running outside a limit is remembered (`note_bypasses`).
BYPASS_MEMORY = timedelta(hours=1)
#: How long a SQLite worker that stopped claiming under a limit stays known as one that
#: counts it (cairnqd_limit_workers), longer than it takes to renew (a worker that
#: claims renews every `WORKER_NOTE_EVERY_S` of cairnqd/store/limits.py).
WORKERS_MEMORY = timedelta(days=1)
#: At most this many running bypasses of one limit are noted per look.
_NOTED_MOST = 100


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


def span_text(ms: int) -> str:
    """A short wait as people read it: 120 ms, 1.5s, 4m 10s."""
    return f"{ms} ms" if ms < 1000 else elapsed_text(ms / 1000, " ")


@dataclass(frozen=True)
class RoomWait:
    """One budget with no room now: a due task that needs it is not claimed until
    room comes back (docs/limits.md, "Seeing and changing them")."""

    limit: str
    partition: str
    #: "concurrency" or "rate".
    kind: str
    #: Tasks running under it (concurrency) or starts in the window (rate).
    in_use: int
    capacity: int
    #: Rate: milliseconds until the earliest start leaves the window; None otherwise.
    opens_in_ms: int | None = None
    #: Rate: the window's length, for the description.
    window_ms: int | None = None
    #: Whether the limit has partitions (`partition_by`): the description names it.
    partitioned: bool = False

    def describe(self) -> str:
        where = f"limit {self.limit}"
        if self.partitioned:
            where += f" (partition {self.partition})"
        if self.kind == "concurrency":
            what = f"{self.in_use}/{self.capacity} running"
        else:
            window = format_duration(timedelta(milliseconds=self.window_ms or 0))
            what = f"rate {self.capacity}/{window} full"
            if self.opens_in_ms is not None:
                what += f"; opens in {span_text(self.opens_in_ms)}"
        return f"waiting for room in {where}: {what}"

    def to_json(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "partition": self.partition,
            "kind": self.kind,
            "in_use": self.in_use,
            "capacity": self.capacity,
            "opens_in_ms": self.opens_in_ms,
        }


def full_budgets(limit: Limit, part: PartitionUsage) -> list[RoomWait]:
    """The budgets of `limit` in which partition `part` has no room now: concurrency
    when as many of its tasks run as the limit allows (or more, after it was lowered),
    rate when its window holds as many starts as the rate allows. The one test of
    "full" behind the dashboard's marks and `cairnqd inspect`."""
    full = []
    partitioned = limit.partition_by is not None
    if limit.concurrency is not None and part.in_use >= limit.concurrency:
        full.append(
            RoomWait(
                limit.name,
                part.part,
                "concurrency",
                part.in_use,
                limit.concurrency,
                partitioned=partitioned,
            )
        )
    if limit.rate is not None and part.starts >= limit.rate.count:
        full.append(
            RoomWait(
                limit.name,
                part.part,
                "rate",
                part.starts,
                limit.rate.count,
                opens_in_ms=part.window_frees_in_ms or 0,
                window_ms=limit.rate.window_ms,
                partitioned=partitioned,
            )
        )
    return full


@dataclass(frozen=True)
class Bypass:
    """A task a limit covers that ran outside it, and who claimed it: running now, or
    seen running within `BYPASS_MEMORY` (`seen_ago_ms`)."""

    limit: str
    task_id: str
    name: str
    worker_id: str
    #: None: running now; else how long ago a daemon last saw it running.
    seen_ago_ms: int | None = None
    queue: str = ""

    @property
    def running(self) -> bool:
        return self.seen_ago_ms is None

    def when(self) -> str:
        """ "runs outside it", or when it was last seen doing so."""
        if self.seen_ago_ms is None:
            return "runs outside it"
        return f"ran outside it (seen {elapsed_text(self.seen_ago_ms / 1000)} ago)"

    def describe(self) -> str:
        return (
            f"limit {self.limit}: task {self.task_id} ({self.name}) {self.when()}, "
            f"claimed by worker {self.worker_id}, which does not keep this limit "
            "(a public SDK worker, or a cairnqd worker configured without it)"
        )


def _bypass(limit: str, row: Any, ago: int | None = None) -> Bypass:
    """A limit_bypass.sql or limit_bypass_seen.sql row as a `Bypass`."""
    fields = (str(row["id"]), str(row["name"]), str(row["worker_id"]))
    return Bypass(limit, *fields, seen_ago_ms=ago, queue=str(row["queue"]))


def _now_ms() -> int:
    return int(time.time() * 1000)


def _held(rows: Sequence[Any], parts: dict[str, dict[str, Any]], limit: Limit) -> None:
    """What limit_usage.sql (or limit_room_task.sql) rows say each partition holds, as
    `PartitionUsage` fields into `parts`: of the budgets `limit` has (on SQLite the
    concurrency rows count running tasks, whether the limit has a concurrency or not)."""
    kinds = {kind for kind, _ in limit.budgets}
    for row in rows:
        if row["kind"] not in kinds:
            continue
        part = parts[str(row["part"])]
        if row["kind"] == "concurrency":
            part["in_use"] = int(row["used"] or 0)
        else:
            part["starts"] = int(row["used"] or 0)
            if row["frees_at_ms"] is not None:
                frees = int(row["frees_at_ms"]) - int(row["now_ms"])
                part["window_frees_in_ms"] = max(0, frees)


class LimitTable:
    def __init__(self, executor: Executor) -> None:
        self._db = executor

    async def usage(self, limits: Sequence[Limit]) -> list[LimitUsage]:
        """Each limit's partitions as they stand (those with anything held or waiting)."""
        out = []
        for limit in limits:
            parts: dict[str, dict[str, Any]] = defaultdict(dict)
            cover = self._cover(limit)
            rows = await self._db.fetch(
                "extensions/limit_usage", {"limit_name": limit.name, **cover}
            )
            _held(rows, parts, limit)
            for row in await self._db.fetch("extensions/limit_waiting", cover):
                parts[str(row["part"])]["waiting"] = int(row["waiting"])
            shown = [
                PartitionUsage(part=name, **values)
                for name, values in sorted(parts.items())
                if any(values.get(k) for k in ("in_use", "starts", "waiting"))
            ]
            out.append(LimitUsage(limit, tuple(shown)))
        return out

    async def waiting_for(self, task: Task, limits: Sequence[Limit]) -> list[RoomWait]:
        """Why `task` is not claimed yet, if a limit holds it back: each budget it needs
        (its partition's, by the limit's `partition_by`) that has no room now, when the
        task is queued and due. `limits` as configured: the operator's overrides are
        applied here. Empty when nothing holds it back."""
        if task.status != "queued":
            return []
        covering = [lim for lim in limits if lim.covers(task.queue, task.name)]
        if not covering:
            return []
        waits = []
        for limit in overridden(covering, await self.overrides()):
            params = {"id": task.id, "limit_name": limit.name, **self._cover(limit)}
            rows = await self._db.fetch("extensions/limit_room_task", params)
            if not rows:
                return []  # not queued or not due (any more): nothing waits for room
            part = str(rows[0]["part"])
            parts: dict[str, dict[str, Any]] = defaultdict(dict)
            _held(rows, parts, limit)
            waits += full_budgets(limit, PartitionUsage(part=part, **parts[part]))
        return waits

    async def holding_back(self, usages: Sequence[LimitUsage]) -> dict[str, list[str]]:
        """Per queue, the names of the limits that hold back due tasks on it now: a
        budget of the limit is full (`full_budgets`) in a partition that has due tasks
        on that queue. `usages` as `usage` read them; queues held back by nothing are
        left out."""
        found: dict[str, list[str]] = defaultdict(list)
        for usage in usages:
            full = [p.part for p in usage.partitions if p.waiting and full_budgets(usage.limit, p)]
            if not full:
                continue
            params = {**self._cover(usage.limit), "parts": full}
            for row in await self._db.fetch("extensions/limit_room_queues", params):
                if int(row["waiting"]):
                    found[str(row["queue"])].append(usage.limit.name)
        return {queue: sorted(names) for queue, names in sorted(found.items())}

    def _cover(self, limit: Limit) -> dict[str, Any]:
        postgres = self._db.dialect == "postgres"
        path: Any = None
        if limit.partition_by is not None:
            path = list(limit.partition_by) if postgres else "$." + ".".join(limit.partition_by)
        globs = [like_pattern(g) for g in limit.names] if postgres else list(limit.names)
        return {"queues": list(limit.queues), "globs": globs, "path": path}

    async def bypassing(
        self, limits: Sequence[Limit], *, most: int = 20, running_only: bool = False
    ) -> list[Bypass]:
        """Tasks that a concurrency limit covers but whose claim took none of its room:
        claimed by a worker that does not know the limit (docs/limits.md, "What stays
        outside the guarantee"). Those running now, oldest first, then (unless
        `running_only`) those a daemon saw running within `BYPASS_MEMORY`
        (`note_bypasses`), latest first; at most `most` of each per limit."""
        found: list[Bypass] = []
        for limit in limits:
            running = await self._running_bypasses(limit, most)
            found += running
            if running_only or limit.concurrency is None:
                continue
            since = _now_ms() - int(BYPASS_MEMORY.total_seconds() * 1000)
            params = {"limit_name": limit.name, "since_ms": since, "limit": most}
            now_running = {(b.task_id, b.worker_id) for b in running}
            for row in await self._db.fetch("extensions/limit_bypass_seen", params):
                if (str(row["id"]), str(row["worker_id"])) in now_running:
                    continue
                ago = max(0, _now_ms() - int(row["seen_at_ms"]))
                found.append(_bypass(limit.name, row, ago))
        return found

    async def note_bypasses(self, limits: Sequence[Limit]) -> int:
        """Remember the claims running outside `limits` now, and forget those last seen
        before `BYPASS_MEMORY` ago: a daemon's maintenance calls this every few seconds,
        so a warning names a worker that passed a limit by after its task has ended.
        How many run outside a limit now."""
        count = 0
        for limit in limits:
            running = await self._running_bypasses(limit, _NOTED_MOST)
            count += len(running)
            if running:
                seen = [
                    {"id": b.task_id, "worker_id": b.worker_id, "name": b.name, "queue": b.queue}
                    for b in running
                ]
                params = {"limit_name": limit.name, "seen": json.dumps(seen)}
                await self._db.fetch("extensions/limit_bypass_note", params)
        await self.forget_bypasses_before(_now_ms() - int(BYPASS_MEMORY.total_seconds() * 1000))
        return count

    async def forget_bypasses_before(self, before_ms: int) -> None:
        """Forget the claims past limits last seen before `before_ms` (epoch ms), and on
        SQLite the workers that have not claimed under a limit for `WORKERS_MEMORY` and
        run nothing now."""
        await self._db.fetch("extensions/limit_bypass_prune", {"forget_before_ms": before_ms})
        if self._db.dialect == "sqlite":
            forget = _now_ms() - int(WORKERS_MEMORY.total_seconds() * 1000)
            await self._db.fetch("extensions/limit_workers_prune", {"forget_before_ms": forget})

    async def _running_bypasses(self, limit: Limit, most: int) -> list[Bypass]:
        if limit.concurrency is None:
            return []  # a rate slot is reused once its window passes: no record left
        params = {**self._cover(limit), "limit_name": limit.name, "limit": most}
        rows = await self._db.fetch("extensions/limit_bypass", params)
        return [_bypass(limit.name, row) for row in rows]

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


__all__ = [
    "NO_PARTITION",
    "Bypass",
    "LimitTable",
    "LimitUsage",
    "PartitionUsage",
    "RoomWait",
    "full_budgets",
    "span_text",
]
