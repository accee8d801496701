"""The checker: walks the YAML document against the schema, collecting every
problem and warning with its position instead of stopping at the first."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from cairnqd.config.checks import Checkable
from cairnqd.config.dsn import dsn_problem
from cairnqd.config.kinds import INVALID, Invalid, suggest
from cairnqd.config.problems import ConfigProblem
from cairnqd.config.schema import Setting, child_settings
from cairnqd.config.sections import GroupConfig
from cairnqd.config.units import format_duration
from cairnqd.config.yamlload import (
    Position,
    YamlEntry,
    YamlMapping,
    YamlNode,
    YamlPath,
    YamlScalar,
    YamlSequence,
    format_path,
    locate,
)


def _synthetic(value: Any, position: Position) -> YamlNode:
    """A schema default as a node, so it goes through the same checks as input."""
    if isinstance(value, dict):
        entries = {k: YamlEntry(position, _synthetic(v, position)) for k, v in value.items()}
        return YamlMapping(entries, position)
    if isinstance(value, list):
        return YamlSequence(tuple(_synthetic(v, position) for v in value), position)
    return YamlScalar(value, position)


def _unknown_key(key: str, known: Sequence[str]) -> str:
    return f"unknown key {key!r}" + (
        suggest(key, known) or f" (expected one of: {', '.join(known)})"
    )


#: A secret file longer than this is refused (a DSN is a few hundred characters).
_MAX_SECRET_CHARS = 64 * 1024


class Checker:
    """Collects problems while the schema walks the document."""

    def __init__(self, root: YamlNode, env: Mapping[str, str], base_dir: str = ".") -> None:
        self.root = root
        self.env = env
        #: Relative paths in the file are taken from here: the file's own directory.
        self.base_dir = os.path.abspath(base_dir)
        self.problems: list[ConfigProblem] = []
        self.warnings: list[ConfigProblem] = []
        #: Paths whose value the loader already reported as unusable.
        self.lost: set[YamlPath] = set()

    # -- reporting

    def error(self, position: Position, path: YamlPath, message: str) -> None:
        problem = ConfigProblem(
            position.file, position.line, position.col, format_path(path), message
        )
        if problem not in self.problems:  # an alias repeats its node's problems
            self.problems.append(problem)

    def error_at(self, path: YamlPath, message: str) -> None:
        self.error(self.position(path), path, message)

    def warn_at(self, path: YamlPath, message: str) -> None:
        at = self.position(path)
        self.warnings.append(ConfigProblem(at.file, at.line, at.col, format_path(path), message))

    def position(self, path: YamlPath) -> Position:
        return locate(self.root, path)

    # -- walking

    def guard(self, check: Callable[..., Any], node: YamlNode, path: YamlPath, *args: Any) -> Any:
        """Run `check(checker, node, path, *args)`; a failure is reported and becomes
        `INVALID`."""
        if path in self.lost:
            return INVALID
        try:
            return check(self, node, path, *args)
        except Invalid as exc:
            self.error((exc.node or node).position, (*path, *exc.suffix), exc.message)
            return INVALID

    def value(self, kind: Checkable, node: YamlNode, path: YamlPath) -> Any:
        return self.guard(kind.check, node, path)

    def setting(self, setting: Setting, node: YamlNode, path: YamlPath) -> Any:
        if setting.nullable and isinstance(node, YamlScalar) and node.value is None:
            return None
        return self.value(setting.kind, node, path)

    def section(self, node: YamlMapping, pattern: str, path: YamlPath) -> dict[str, Any]:
        settings = child_settings(pattern)
        keys = [s.key for s in settings]
        for key, written in node.entries.items():
            if key not in keys:
                self.error(written.key_position, (*path, key), _unknown_key(key, keys))
        values: dict[str, Any] = {}
        for setting in settings:
            entry = node.entries.get(setting.key)
            if entry is None and setting.required:
                self.error(node.position, path, f"missing required key {setting.key!r}")
                values[setting.key] = INVALID
                continue
            child = _synthetic(setting.default, node.position) if entry is None else entry.node
            values[setting.key] = self.setting(setting, child, (*path, setting.key))
        return values

    # -- cross-field checks that need the outside world

    def resolve_path(self, text: str) -> str:
        """`text` made absolute against the config file's directory (`~` expanded).
        SQLite's own names, `:memory:` and `file:` URIs, are left alone."""
        if text == ":memory:" or text.startswith("file:"):
            return text
        return os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(text)))

    def read_secret(self, path: YamlPath, filename: str) -> Any:
        try:
            with open(filename, encoding="utf-8") as f:
                # Bounded: a DSN is short, and /dev/zero never ends.
                text = f.read(_MAX_SECRET_CHARS + 1)
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
            self.error_at(path, f"cannot read {filename}: {reason or exc}")
            return INVALID
        if len(text) > _MAX_SECRET_CHARS:
            self.error_at(path, f"{filename} is longer than {_MAX_SECRET_CHARS} characters")
            return INVALID
        text = text.rstrip("\r\n")
        problem = "is empty" if not text.strip() else dsn_problem(text)
        if problem:
            self.error_at(path, f"{filename} does not hold a DSN: {problem}")
            return INVALID
        return text

    def check_sqlite_dir(self, path: YamlPath, filename: str) -> None:
        directory = os.path.dirname(os.path.abspath(filename))
        if os.path.isdir(filename):
            self.error_at(path, f"{filename} is a directory")
        elif not os.path.isdir(directory):
            self.error_at(path, f"directory {directory} does not exist")
        elif not os.access(directory, os.W_OK | os.X_OK):
            # SQLite in WAL mode creates -wal and -shm files next to the database.
            self.error_at(path, f"directory {directory} is not writable")

    def inherit_handlers(self, groups: Mapping[str, GroupConfig], top: tuple[str, ...]) -> Any:
        result: dict[str, GroupConfig] = {}
        for name, group in groups.items():
            handlers = top if group.handlers is None else group.handlers
            if not handlers:
                message = "no handlers: list them at the top level or in this group"
                self.error_at(("groups", name), message)
                return INVALID
            result[name] = replace(group, handlers=handlers)
        return MappingProxyType(result)

    def warn_max_run(self, groups: Mapping[str, GroupConfig], shutdown: timedelta) -> None:
        for name, group in groups.items():
            limit = group.shutdown_timeout or shutdown
            if group.max_run is not None and group.max_run > limit:
                self.warn_at(
                    ("groups", name, "max_run"),
                    f"{format_duration(group.max_run)} is longer than the shutdown_timeout "
                    f"of {format_duration(limit)}: a task still running when a drain ends "
                    "is cut off and runs again from the start (its attempt is given back "
                    "up to 3 times, then spent)",
                )
