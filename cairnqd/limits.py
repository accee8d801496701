"""Flow control: how many tasks of a kind may execute at once, and how often they may
start, across every worker on one database (docs/limits.md).

A `Limit` names the tasks it covers (queues and/or task-name globs), a `concurrency`
and/or a `rate`, and optionally a payload field that gives each of its values a budget
of its own. `parse_limits` reads the mapping `Worker(limits=...)` and the daemon's
`limits:` section share; how the budget is kept lives in `cairnqd/store/limits.py`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

LIMIT_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
# A dotted path of plain keys: each part is embedded in SQL as a literal, so nothing
# but these characters may reach it.
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\S+)\s*$")
_GLOB = re.compile(r"^[A-Za-z0-9_.:*?-]+$")
#: The partition of a task whose payload lacks the field (or holds null there).
NO_PARTITION = "(none)"
#: The most slots one limit's budget may hold (each is a row per partition).
MAX_CAPACITY = 10_000
_KEYS = ("queues", "names", "concurrency", "rate", "partition_by")


@dataclasses.dataclass(frozen=True)
class Rate:
    """At most `count` starts in any window of `window_ms`."""

    count: int
    window_ms: int

    def __str__(self) -> str:
        return f"{self.count}/{self.window_ms}ms"


@dataclasses.dataclass(frozen=True)
class Limit:
    name: str
    queues: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    concurrency: int | None = None
    rate: Rate | None = None
    #: The payload field (its dotted path, split) whose values each get a budget.
    partition_by: tuple[str, ...] | None = None

    def covers(self, queue: str, name: str) -> bool:
        """Whether a task on `queue` named `name` needs room in this limit: it must be
        on one of `queues` (when given) and match one of `names` (when given)."""
        if self.queues and queue not in self.queues:
            return False
        return not self.names or any(fnmatch.fnmatchcase(name, g) for g in self.names)

    @property
    def partition_field(self) -> str | None:
        """`partition_by` as written: payload.tenant."""
        return None if self.partition_by is None else "payload." + ".".join(self.partition_by)

    @property
    def budgets(self) -> tuple[tuple[str, int], ...]:
        """(kind, capacity) of each budget a start takes from: concurrency first."""
        kinds: list[tuple[str, int]] = []
        if self.concurrency is not None:
            kinds.append(("concurrency", self.concurrency))
        if self.rate is not None:
            kinds.append(("rate", self.rate.count))
        return tuple(kinds)


@dataclasses.dataclass(frozen=True)
class Override:
    """An operator's change to a limit (`cairnqd limits set`), kept in the database for
    every host until a reload of the config clears it; None keeps the config's value."""

    name: str
    concurrency: int | None
    rate: Rate | None
    set_by: str
    set_at_ms: int
    reason: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Override:
        count, window = row["rate_count"], row["rate_window_ms"]
        return cls(
            name=str(row["limit_name"]),
            concurrency=None if row["concurrency"] is None else int(row["concurrency"]),
            rate=None if count is None or window is None else Rate(int(count), int(window)),
            set_by=str(row["set_by"]),
            set_at_ms=int(row["set_at_ms"]),
            reason=None if row["reason"] is None else str(row["reason"]),
        )


def overridden(limits: Sequence[Limit], overrides: Iterable[Override]) -> tuple[Limit, ...]:
    """`limits` with each operator's override applied: a value it sets replaces the
    config's, but only where the config sets that kind (an override cannot give a
    rate to a limit that has none: its tasks' slots of that kind do not exist)."""
    by_name = {o.name: o for o in overrides}
    out = []
    for limit in limits:
        o = by_name.get(limit.name)
        if o is not None:
            if o.concurrency is not None and limit.concurrency is not None:
                limit = dataclasses.replace(limit, concurrency=o.concurrency)
            if o.rate is not None and limit.rate is not None:
                limit = dataclasses.replace(limit, rate=o.rate)
        out.append(limit)
    return tuple(out)


def may_cover(limits: Iterable[Limit], queues: Iterable[str]) -> bool:
    """Whether one of `limits` may cover a task of `queues`: one on one of them, or one
    by task names alone (any queue). Claims of queues that none covers are unlimited."""
    wanted = set(queues)
    return any(not lim.queues or not wanted.isdisjoint(lim.queues) for lim in limits)


def like_pattern(glob: str) -> str:
    """A name glob (* and ?, the only wildcards `parse_limit` lets through) as a SQL
    LIKE pattern: `_` is LIKE's one-character wildcard, escaped with its default `\\`."""
    return glob.replace("\\", "\\\\").replace("_", "\\_").replace("*", "%").replace("?", "_")


def parse_rate(value: object, where: str) -> Rate:
    """`N/DURATION` ("100/10s", "5/1m", "200/1s")."""
    text = value if isinstance(value, str) else ""
    match = _RATE.fullmatch(text)
    if match is None:
        raise ValueError(f"{where} must be COUNT/DURATION such as 100/10s or 5/1m; got {value!r}")
    # config imports this module
    from cairnqd.config.bounds import MAX_DURATION
    from cairnqd.config.units import format_duration, parse_duration_ms

    count = int(match.group(1))
    try:
        window_ms = parse_duration_ms(match.group(2))
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    longest_ms = int(MAX_DURATION.total_seconds() * 1000)
    if window_ms > longest_ms:
        # A slot is held until its start plus the window: past 100 years that time
        # leaves what the store takes (and a bigint, far enough out).
        raise ValueError(
            f"{where}: the window must be at most {format_duration(MAX_DURATION)}; "
            f"got {match.group(2)!r}"
        )
    if not 1 <= count <= MAX_CAPACITY:
        raise ValueError(f"{where}: the count must be between 1 and {MAX_CAPACITY}; got {count}")
    if window_ms < 1:
        raise ValueError(f"{where}: the window must be at least 1ms; got {match.group(2)!r}")
    return Rate(count, window_ms)


def parse_field(value: object, where: str) -> tuple[str, ...]:
    """`payload.tenant` (or `tenant`) as the path of keys under the payload."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where} must be a payload field such as payload.tenant; got {value!r}")
    parts = value.split(".")
    if parts[0] == "payload":
        parts = parts[1:]
    if not parts or not all(_FIELD.fullmatch(p) for p in parts):
        raise ValueError(
            f"{where} must be a dotted path of plain keys under the payload "
            f"(letters, digits, _), such as payload.tenant; got {value!r}"
        )
    return tuple(parts)


def _strings(value: object, where: str, *, glob: bool) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise ValueError(f"{where} must be a non-empty list of strings; got {value!r}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise ValueError(f"{where}[{i}] must be a non-empty string; got {item!r}")
        if glob and not _GLOB.fullmatch(item):
            raise ValueError(
                f"{where}[{i}]: a name glob takes letters, digits, . _ : - and the "
                f"wildcards * and ?; got {item!r}"
            )
        out.append(item)
    return tuple(dict.fromkeys(out))


def _capacity(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} must be a whole number; got {value!r}")
    if not 1 <= value <= MAX_CAPACITY:
        raise ValueError(f"{where} must be between 1 and {MAX_CAPACITY}; got {value}")
    return value


def parse_limit(name: object, spec: object, where: str = "limits") -> Limit:
    """One limit from its mapping; a ValueError names the key that is wrong."""
    if not isinstance(name, str) or not LIMIT_NAME.fullmatch(name):
        raise ValueError(f"{where}: a limit's name must match {LIMIT_NAME.pattern}; got {name!r}")
    at = f"{where}.{name}"
    if not isinstance(spec, Mapping):
        raise ValueError(f"{at} must be a mapping of {', '.join(_KEYS)}; got {spec!r}")
    unknown = [k for k in spec if k not in _KEYS]
    if unknown:
        raise ValueError(f"{at}: unknown key {unknown[0]!r}; a limit takes {', '.join(_KEYS)}")
    queues = _strings(spec["queues"], f"{at}.queues", glob=False) if "queues" in spec else ()
    names = _strings(spec["names"], f"{at}.names", glob=True) if "names" in spec else ()
    if not queues and not names:
        raise ValueError(f"{at} must say which tasks it covers: queues, names, or both")
    concurrency = spec.get("concurrency")
    rate = spec.get("rate")
    if concurrency is None and rate is None:
        raise ValueError(f"{at} must set concurrency, rate, or both")
    partition = spec.get("partition_by")
    return Limit(
        name=name,
        queues=queues,
        names=names,
        concurrency=None if concurrency is None else _capacity(concurrency, f"{at}.concurrency"),
        rate=None if rate is None else parse_rate(rate, f"{at}.rate"),
        partition_by=None if partition is None else parse_field(partition, f"{at}.partition_by"),
    )


def parse_limits(spec: Mapping[str, Any] | Iterable[Limit] | None) -> tuple[Limit, ...]:
    """`{name: {queues, names, concurrency, rate, partition_by}}`, or Limits already
    made, as a tuple in name order."""
    if spec is None:
        return ()
    if isinstance(spec, Mapping):
        made = [parse_limit(name, body) for name, body in spec.items()]
    else:
        made = list(spec)
        for item in made:
            if not isinstance(item, Limit):
                raise ValueError(f"limits must be a mapping or Limit objects; got {item!r}")
    seen: set[str] = set()
    for limit in made:
        if limit.name in seen:
            raise ValueError(f"limits: {limit.name!r} is defined twice")
        seen.add(limit.name)
    return tuple(sorted(made, key=lambda limit: limit.name))


__all__ = [
    "NO_PARTITION",
    "Limit",
    "Override",
    "Rate",
    "may_cover",
    "overridden",
    "parse_limit",
    "parse_limits",
    "parse_rate",
]
