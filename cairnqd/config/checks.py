"""`Checks`: what the kinds and the section finishers ask of the config checker while
they read a value (report an error or warning at a path, check a nested value, read a
file). checker.py implements it; the modules that only use it depend on this protocol,
not on the checker."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Protocol

from cairnqd.config.sections import GroupConfig
from cairnqd.config.yamlload import Position, YamlMapping, YamlNode, YamlPath


class Checkable(Protocol):
    """Anything that checks one YAML node (every `Kind`)."""

    def check(self, ck: Checks, node: YamlNode, path: YamlPath) -> Any: ...


class Checks(Protocol):
    env: Mapping[str, str]

    def error(self, position: Position, path: YamlPath, message: str) -> None:
        """An error at `position` (a key's, for a bad name)."""
        ...

    def error_at(self, path: YamlPath, message: str) -> None:
        """An error at the node of `path`."""
        ...

    def warn_at(self, path: YamlPath, message: str) -> None:
        """A warning at the node of `path`."""
        ...

    def guard(self, check: Callable[..., Any], node: YamlNode, path: YamlPath, *args: Any) -> Any:
        """`check(self, node, path, *args)`, its error recorded and INVALID returned."""
        ...

    def value(self, kind: Checkable, node: YamlNode, path: YamlPath) -> Any:
        """The value of `node` as `kind` reads it, or INVALID."""
        ...

    def section(self, node: YamlMapping, pattern: str, path: YamlPath) -> dict[str, Any]:
        """Every setting of the section `pattern`, checked, defaults filled in."""
        ...

    def resolve_path(self, text: str) -> str:
        """A path as written, made absolute from the config file's directory."""
        ...

    def read_secret(self, path: YamlPath, filename: str) -> Any:
        """A secret file's text, or INVALID with the error recorded at `path`."""
        ...

    def check_sqlite_dir(self, path: YamlPath, filename: str) -> None:
        """Errors for a SQLite path whose directory cannot hold the database."""
        ...

    def inherit_handlers(self, groups: Mapping[str, GroupConfig], top: tuple[str, ...]) -> Any:
        """Groups without `handlers` given the top-level list."""
        ...

    def warn_max_run(self, groups: Mapping[str, GroupConfig], shutdown: timedelta) -> None:
        """Warnings for a `max_run` longer than the shutdown timeout."""
        ...


__all__ = ["Checkable", "Checks"]
