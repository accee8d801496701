"""The reload diff: which settings changed between two configs, and what a reload
does about each."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cairnqd.config.root import Config
from cairnqd.config.schema import BY_PATH, Reload, dump_section


@dataclass(frozen=True)
class ConfigChange:
    """One changed setting and what a reload does about it."""

    path: str
    reload: Reload

    def __str__(self) -> str:
        return f"{self.path} ({self.reload.value})"


def _flatten(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            yield from _flatten(value, path)
        else:
            yield path, value


#: Top-level sections of named entries, and what adding or removing an entry does.
_NAMED = {"groups": Reload.ROLL, "schedules": Reload.HOT, "limits": Reload.HOT}


def _reload_of(path: str) -> Reload:
    parts = path.split(".")
    if parts[0] in _NAMED and len(parts) > 2:
        parts[1] = "*"
    while parts:
        setting = BY_PATH.get(".".join(parts))
        if setting is not None and setting.reload is not None:
            return setting.reload
        parts.pop()
    return Reload.RESTART


def diff_configs(old: Config, new: Config) -> list[ConfigChange]:
    """Changed settings, in schema order; an added or removed group or schedule is one
    change."""
    before, after = dict(_flatten(dump_section(old, ""))), dict(_flatten(dump_section(new, "")))
    moved: set[tuple[str, str]] = set()
    changes: list[ConfigChange] = []
    for section, reload in _NAMED.items():
        was, now = getattr(old, section), getattr(new, section)
        for name in dict.fromkeys([*was, *now]):
            if (name in was) != (name in now):
                moved.add((section, name))
                changes.append(ConfigChange(f"{section}.{name}", reload))
    missing = object()
    for path in dict.fromkeys([*before, *after]):
        parts = path.split(".")
        if len(parts) > 1 and (parts[0], parts[1]) in moved:
            continue
        if before.get(path, missing) != after.get(path, missing):
            changes.append(ConfigChange(path, _reload_of(path)))
    return changes
