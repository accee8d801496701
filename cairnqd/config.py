"""The daemon's configuration: one schema, frozen dataclasses, every error at once.

Design note. `SCHEMA` lists every setting once: its YAML path, kind, default, doc
comment and reload class (DAEMON.md §4). That one table drives validation, the
defaults, the canonical dump behind `config dump` and fingerprints, the reload diff
and `config/cairnq.example.yaml` (`render_example()`), so none of them can drift from
the others (gunicorn's `Setting` registry does the same for its CLI and docs).

Loading never stops at the first problem. Each setting is checked where it is
written; a bad one becomes `_INVALID` and checks that depend on it are skipped, so
one typo yields one message. Every problem carries `file:line:col` and the YAML
path, and `load_config` raises them together as `ConfigError` (exit 78 in the CLI).
Only a YAML syntax error, which stops the parser, comes alone.

Decisions worth knowing:
- Durations need a unit (`250ms`, `30s`, `5m`, `1h`, `7d`, `1h30m`); a bare number
  is an error, because `lease: 30` could mean seconds or milliseconds. They load as
  `timedelta`; `to_ms()` gives the SDK's integer milliseconds exactly.
- `handlers` lists `module:attribute` registries. A group's own `handlers` list
  *replaces* the top-level one (null inherits it): a group serving a dedicated queue
  should not import, or claim for, every other group's handlers.
- Relative paths (`database.path`, `database.dsn_file`, `logging.file`) are taken
  from the working directory, as the children inherit it.
- Backend-dependent defaults (`database.auto_migrate`, `retention.batch`) and
  `runtime_dir` are resolved at load, so a dump shows what actually runs.
"""

from __future__ import annotations

import difflib
import enum
import hashlib
import ipaddress
import json
import os
import re
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Literal

from .errors import CairnQError
from .registry import parse_handler_path
from .yamlload import (
    Position,
    ScalarValue,
    YamlEntry,
    YamlMapping,
    YamlNode,
    YamlPath,
    YamlScalar,
    YamlSequence,
    YamlSyntaxError,
    format_path,
    interpolate,
    load_yaml,
    locate,
    resolve_plain,
)

__all__ = [
    "SCHEMA",
    "Config",
    "ConfigChange",
    "ConfigError",
    "ConfigProblem",
    "DatabaseConfig",
    "GroupConfig",
    "ListenAddress",
    "LoggingConfig",
    "MetricsConfig",
    "PurgeRule",
    "ReaperConfig",
    "Reload",
    "ReloadConfig",
    "RetentionConfig",
    "Setting",
    "diff_configs",
    "format_duration",
    "format_size",
    "load_config",
    "parse_duration",
    "parse_size",
    "redact_dsn",
    "render_example",
    "to_ms",
]


# --- problems ---------------------------------------------------------------------


class Reload(enum.Enum):
    """What a reload does with a changed setting (DAEMON.md §4)."""

    RESTART = "restart-only"
    HOT = "parent-hot"
    SIZE = "size-only"
    ROLL = "roll"


@dataclass(frozen=True, order=True)
class ConfigProblem:
    file: str
    line: int
    col: int
    path: str
    message: str

    def __str__(self) -> str:
        where = self.file if self.line == 0 else f"{self.file}:{self.line}:{self.col}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class ConfigError(CairnQError):
    """The config cannot be used; `problems` holds every reason, sorted by position."""

    def __init__(
        self, problems: Sequence[ConfigProblem], warnings: Sequence[ConfigProblem] = ()
    ) -> None:
        self.problems = list(problems)
        self.warnings = list(warnings)
        super().__init__("\n".join(str(p) for p in self.problems))


# --- units ------------------------------------------------------------------------

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?")
_DURATION_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1))
_SIZE = re.compile(r"(\d+)([KMGT]i?B|B)")
_SIZE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}


def parse_duration(text: str) -> timedelta:
    """`"1h30m"` -> 90 minutes. Units descend, each at most once. ValueError if bad."""
    match = _DURATION.fullmatch(text)
    if match is None or not any(match.groups()):
        raise ValueError(f"not a duration: {text!r}")
    counts = (int(n or 0) for n in match.groups())
    ms = sum(n * unit for n, (_, unit) in zip(counts, _DURATION_UNITS, strict=True))
    try:
        return timedelta(milliseconds=ms)
    except OverflowError:
        raise ValueError(f"duration too large: {text!r}") from None


def to_ms(duration: timedelta) -> int:
    """Exact integer milliseconds, as the protocol and SDK count time."""
    return duration // timedelta(milliseconds=1)


def format_duration(duration: timedelta) -> str:
    """The canonical spelling `parse_duration` reads back: 90 minutes -> `1h30m`."""
    rest = to_ms(duration)
    parts = []
    for suffix, unit in _DURATION_UNITS:
        count, rest = divmod(rest, unit)
        if count:
            parts.append(f"{count}{suffix}")
    return "".join(parts) or "0s"


def parse_size(text: str) -> int:
    """`"512MiB"` -> bytes. ValueError if bad."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a size: {text!r}")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def format_size(size: int) -> str:
    """The shortest exact spelling: 2**30 -> `1GiB`, 500_000_000 -> `500MB`."""
    exact = [(size // unit, name) for name, unit in _SIZE_UNITS.items() if size % unit == 0]
    count, name = min(exact)
    return f"{count}{name}"


# --- the config -------------------------------------------------------------------


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"


@dataclass(frozen=True)
class DatabaseConfig:
    path: str | None
    #: The DSN, read from `dsn_file` when that is set. Never log it: see `redact_dsn`.
    dsn: str | None = field(repr=False)
    dsn_file: str | None
    connect_timeout: timedelta
    busy_timeout: timedelta
    connections_per_child: int
    expected_hosts: int
    connection_check: str
    auto_migrate: bool
    lock_namespace: int

    @property
    def backend(self) -> Literal["sqlite", "postgres"]:
        return "sqlite" if self.path is not None else "postgres"


@dataclass(frozen=True)
class GroupConfig:
    name: str
    queues: tuple[str, ...]
    #: Effective handler registries: the group's own list, or the top-level one.
    handlers: tuple[str, ...]
    processes: int
    concurrency: int
    #: "auto" (adaptive) or a fixed count; see `Worker(prefetch=...)`.
    prefetch: int | str
    lease: timedelta
    max_run: timedelta | None
    max_tasks_per_child: int | None
    #: Bytes of RSS.
    max_memory: int | None
    #: None: the top-level `shutdown_timeout` (see `Config.shutdown_timeout_for`).
    shutdown_timeout: timedelta | None
    poll_interval: timedelta
    retry_backoff: timedelta
    retry_backoff_max: timedelta
    resources: Mapping[str, int]


@dataclass(frozen=True)
class MetricsConfig:
    #: None when `listen: off`.
    listen: ListenAddress | None
    stats_ttl: timedelta
    queue_stats: str
    task_name_label: bool
    duration_buckets: tuple[float, ...]
    wait_buckets: tuple[float, ...]


@dataclass(frozen=True)
class PurgeRule:
    older_than: timedelta
    status: str | None
    queue: str | None
    name: str | None

    def describe(self) -> str:
        filters = ", ".join(f"{k}={v}" for k, v in self.filters() if v is not None)
        return f"{filters or 'all finished tasks'}, older than {format_duration(self.older_than)}"

    def filters(self) -> tuple[tuple[str, str | None], ...]:
        return (("status", self.status), ("queue", self.queue), ("name", self.name))


@dataclass(frozen=True)
class RetentionConfig:
    interval: timedelta
    #: Rows per purge call; the backend's default when not set.
    batch: int
    max_batches: int
    rules: tuple[PurgeRule, ...]


@dataclass(frozen=True)
class ReaperConfig:
    interval: timedelta


@dataclass(frozen=True)
class SupervisorConfig:
    restart_budget: int
    restart_window: timedelta
    backoff_max: timedelta
    boot_timeout: timedelta
    heartbeat_timeout: timedelta
    heartbeat_interval: timedelta


@dataclass(frozen=True)
class ReloadConfig:
    max_surge: int


@dataclass(frozen=True)
class LoggingConfig:
    level: str
    format: str
    file: str | None
    loggers: Mapping[str, str]


@dataclass(frozen=True)
class Config:
    version: int
    database: DatabaseConfig
    handlers: tuple[str, ...]
    groups: Mapping[str, GroupConfig]
    shutdown_timeout: timedelta
    metrics: MetricsConfig
    retention: RetentionConfig
    reaper: ReaperConfig
    supervisor: SupervisorConfig
    reload: ReloadConfig
    logging: LoggingConfig
    runtime_dir: str
    #: The file it was loaded from.
    source: str = field(default="", compare=False)
    #: Suspicious but usable settings, for `check` and the startup log.
    warnings: tuple[ConfigProblem, ...] = field(default=(), compare=False)

    def shutdown_timeout_for(self, group: str) -> timedelta:
        return self.groups[group].shutdown_timeout or self.shutdown_timeout

    def to_dict(self, *, redact: bool = True) -> dict[str, Any]:
        """The effective config as YAML-ready values. Unredacted, it loads back equal;
        redacted (`config dump`), DSN passwords and dsn_file contents read `***`."""
        data = _dump(self)
        database = data["database"]
        if self.database.dsn_file is not None:
            database["dsn"] = "***" if redact else None
        elif redact and self.database.dsn is not None:
            database["dsn"] = redact_dsn(self.database.dsn)
        return data

    def redacted(self) -> dict[str, Any]:
        return self.to_dict(redact=True)

    def group_fingerprint(self, name: str) -> str:
        """SHA-256 of the canonical JSON of everything group `name`'s children start
        with, except `processes` (a size-only change). Equal fingerprints: no roll."""
        group = _dump(self.groups[name])
        del group["processes"]
        database = _dump(self.database)
        child_db = {
            s.key: database[s.key] for s in _children("database") if s.reload is Reload.ROLL
        }
        canonical = json.dumps(
            {"group": group, "database": child_db},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()

    def fingerprints(self) -> dict[str, str]:
        return {name: self.group_fingerprint(name) for name in self.groups}


def redact_dsn(dsn: str) -> str:
    """Replace the password of a URL or key=value DSN with `***`."""
    scheme, sep, rest = dsn.partition("://")
    if sep:
        # libpq splits user info at the last '@' of the authority; mirror it.
        userinfo, at, host = rest.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        if at and colon:
            dsn = f"{scheme}://{user}:***@{host}"
    return re.sub(r"(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)", r"\1***", dsn)


# --- kinds: how one setting is read from YAML and written back --------------------


class _InvalidType:
    def __repr__(self) -> str:
        return "<invalid>"


#: Stands in for a value that failed its check, so dependent checks can skip it.
_INVALID: Any = _InvalidType()


class _Invalid(Exception):
    def __init__(self, message: str, node: YamlNode | None = None, suffix: YamlPath = ()):
        super().__init__(message)
        self.message = message
        self.node = node
        self.suffix = suffix


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _show_node(node: YamlNode) -> str:
    if isinstance(node, YamlMapping):
        return "a mapping"
    if isinstance(node, YamlSequence):
        return "a list"
    return _show(node.value)


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class _Kind:
    expected = "a value"

    def check(self, ck: _Checker, node: YamlNode, path: YamlPath) -> Any:
        raise NotImplementedError

    def dump(self, value: Any) -> Any:
        return value

    def fail(self, got: str, hint: str = "") -> _Invalid:
        return _Invalid(f"expected {self.expected}, got {got}{hint}")


class _Scalar(_Kind):
    def check(self, ck: _Checker, node: YamlNode, path: YamlPath) -> Any:
        if not isinstance(node, YamlScalar):
            raise self.fail(_show_node(node))
        return self.convert(node.value)

    def convert(self, value: ScalarValue) -> Any:
        raise NotImplementedError


class _Str(_Scalar):
    expected = "a string"

    def __init__(self, pattern: str | None = None, what: str = "") -> None:
        self.pattern = re.compile(pattern) if pattern else None
        self.what = what

    def convert(self, value: ScalarValue) -> Any:
        if not isinstance(value, str):
            hint = f' (quote it: "{_show(value)}")' if value is not None else ""
            raise self.fail(_show(value), hint)
        if not value.strip():
            raise _Invalid("must not be empty")
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise _Invalid(f"expected {self.what}, got {value!r}")
        return value


class _HandlerPath(_Str):
    def convert(self, value: ScalarValue) -> Any:
        text = super().convert(value)
        try:
            parse_handler_path(text)
        except ValueError as exc:
            raise _Invalid(str(exc)) from None
        return text


class _Path(_Str):
    expected = "a file path"


class _Int(_Scalar):
    def __init__(self, minimum: int | None = None, maximum: int | None = None) -> None:
        self.minimum, self.maximum = minimum, maximum
        bounds = [f"≥ {minimum}"] if minimum is not None else []
        bounds += [f"≤ {maximum}"] if maximum is not None else []
        self.expected = " ".join(["an integer", *bounds])

    def convert(self, value: ScalarValue) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            hint = ""
            if isinstance(value, str) and re.fullmatch(r"0[0-9]+", value):
                hint = f" (a leading zero reads as octal in YAML 1.1; write {int(value)})"
            raise self.fail(_show(value), hint)
        if (self.minimum is not None and value < self.minimum) or (
            self.maximum is not None and value > self.maximum
        ):
            raise self.fail(str(value))
        return value


class _Version(_Scalar):
    expected = "1"

    def convert(self, value: ScalarValue) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value != 1:
            raise self.fail(_show(value), " (this cairnqd reads config version 1)")
        return value


_YAML11_BOOLS = {"yes", "no", "on", "off", "y", "n"}


class _Bool(_Scalar):
    expected = "true or false"

    def convert(self, value: ScalarValue) -> Any:
        if not isinstance(value, bool):
            hint = ""
            if isinstance(value, str) and value.lower() in _YAML11_BOOLS:
                hint = " (YAML 1.2 reads yes/no/on/off as strings)"
            raise self.fail(_show(value), hint)
        return value


class _Enum(_Scalar):
    def __init__(self, *choices: str, fold: bool = False) -> None:
        self.choices = choices
        self.fold = fold
        self.expected = "one of " + ", ".join(c.lower() if fold else c for c in choices)

    def convert(self, value: ScalarValue) -> Any:
        key = value.upper() if self.fold and isinstance(value, str) else value
        if isinstance(key, str) and key in self.choices:
            return key
        word = str(value).lower() if self.fold else str(value)
        raise self.fail(_show(value), _suggest(word, [c.lower() for c in self.choices]))

    def dump(self, value: Any) -> Any:
        return value.lower() if self.fold else value


class _Duration(_Scalar):
    expected = "a duration like 30s, 5m, 1h"

    def __init__(self, minimum: str = "0s") -> None:
        self.minimum = parse_duration(minimum)

    def convert(self, value: ScalarValue) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise self.fail(_show(value), f": add a unit, e.g. {value}s")
        if not isinstance(value, str):
            raise self.fail(_show(value))
        try:
            duration = parse_duration(value)
        except ValueError:
            hint = ""
            if re.fullmatch(r"\d+:\d+(:\d+)?", value):
                hint = " (YAML 1.1 reads 1:30 as 90 seconds; write 1m30s)"
            raise self.fail(_show(value), hint) from None
        if duration < self.minimum:
            raise _Invalid(f"must be at least {format_duration(self.minimum)}, got {value}")
        return duration

    def dump(self, value: Any) -> Any:
        return format_duration(value)


class _Size(_Scalar):
    expected = "a size like 512MiB, 1GiB, 500MB"

    def __init__(self, minimum: str = "1MiB") -> None:
        self.minimum = parse_size(minimum)

    def convert(self, value: ScalarValue) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            raise self.fail(_show(value), ": add a unit, e.g. 512MiB")
        if not isinstance(value, str):
            raise self.fail(_show(value))
        try:
            size = parse_size(value)
        except ValueError:
            raise self.fail(_show(value)) from None
        if size < self.minimum:
            raise _Invalid(f"must be at least {format_size(self.minimum)}, got {value}")
        return size

    def dump(self, value: Any) -> Any:
        return format_size(value)


_HOSTNAME = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
)


class _Listen(_Scalar):
    expected = "host:port (e.g. 127.0.0.1:9464) or off"

    def convert(self, value: ScalarValue) -> Any:
        if value == "off":
            return None
        if not isinstance(value, str):
            raise self.fail(_show(value))
        host, sep, port = value.rpartition(":")
        bracketed = host.startswith("[") and host.endswith("]")
        host = host[1:-1] if bracketed else host
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise self.fail(_show(value))
        if bracketed or ":" in host:
            if not bracketed or not _is_ipv6(host):
                raise self.fail(_show(value), " (write an IPv6 address as [::1]:9464)")
        elif not _HOSTNAME.fullmatch(host):
            raise self.fail(_show(value))
        return ListenAddress(host, int(port))

    def dump(self, value: Any) -> Any:
        return "off" if value is None else str(value)


def _is_ipv6(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False


def _dsn_problem(dsn: str) -> str | None:
    """Why a string cannot be a libpq DSN; never echoes it, as it may hold a password."""
    scheme, sep, _ = dsn.partition("://")
    if sep and scheme not in ("postgres", "postgresql"):
        return f"unsupported scheme {scheme}://: expected postgresql://"
    if not sep and "=" not in dsn:
        return "expected a postgresql:// URL or key=value pairs (host=... dbname=...)"
    return None


class _Dsn(_Str):
    def convert(self, value: ScalarValue) -> Any:
        if not isinstance(value, str):  # do not echo: it may be a secret
            raise _Invalid("expected a string")
        text = super().convert(value)
        problem = _dsn_problem(text)
        if problem:
            raise _Invalid(problem)
        return text


class _List(_Kind):
    def __init__(self, item: _Scalar, *, non_empty: bool = False) -> None:
        self.item = item
        self.non_empty = non_empty
        self.expected = f"a list of {item.expected.removeprefix('a ').removeprefix('an ')}s"

    def check(self, ck: _Checker, node: YamlNode, path: YamlPath) -> Any:
        if not isinstance(node, YamlSequence):
            raise self.fail(_show_node(node))
        if self.non_empty and not node.items:
            raise _Invalid("must list at least one entry")
        values = [ck.value(self.item, item, (*path, i)) for i, item in enumerate(node.items)]
        for i, value in enumerate(values):
            if value is not _INVALID and value in values[:i]:
                raise _Invalid(f"{_show(value)} is listed twice", node.items[i], (i,))
        return _INVALID if _INVALID in values else tuple(values)

    def dump(self, value: Any) -> Any:
        return [self.item.dump(v) for v in value]


class _Buckets(_List):
    def __init__(self) -> None:
        super().__init__(_Number())

    def check(self, ck: _Checker, node: YamlNode, path: YamlPath) -> Any:
        values = super().check(ck, node, path)
        if values is not _INVALID and list(values) != sorted(set(values)):
            raise _Invalid("bucket bounds must increase")
        return values


class _Number(_Scalar):
    expected = "a number > 0"

    def convert(self, value: ScalarValue) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise self.fail(_show(value))
        return float(value)


class _Prefetch(_Scalar):
    expected = "auto or an integer ≥ 0"

    def convert(self, value: ScalarValue) -> Any:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(_show(value))
        return value


class _Map(_Kind):
    def __init__(self, key: _Str, value: _Scalar) -> None:
        self.key, self.value = key, value
        self.expected = "a mapping"

    def check(self, ck: _Checker, node: YamlNode, path: YamlPath) -> Any:
        if not isinstance(node, YamlMapping):
            raise self.fail(_show_node(node))
        result: dict[str, Any] = {}
        for name, entry in node.entries.items():
            try:
                self.key.convert(name)
            except _Invalid as exc:
                ck.error(entry.key_position, (*path, name), exc.message)
                result[name] = _INVALID
                continue
            result[name] = ck.value(self.value, entry.node, (*path, name))
        return _INVALID if _INVALID in result.values() else MappingProxyType(result)

    def dump(self, value: Any) -> Any:
        return {k: self.value.dump(v) for k, v in value.items()}


class _Section(_Kind):
    """A mapping of settings, built into a dataclass."""

    expected = "a mapping"

    def __init__(self, cls: type, finish: _Finish | None = None) -> None:
        self.cls = cls
        self.finish = finish
        self.pattern = ""  # set when SCHEMA is indexed

    def check(self, ck: _Checker, node: YamlNode, path: YamlPath) -> Any:
        return self.build(ck, node, path, {})

    def build(self, ck: _Checker, node: YamlNode, path: YamlPath, extra: dict[str, Any]) -> Any:
        if isinstance(node, YamlScalar) and node.value is None:  # `metrics:` left empty
            node = YamlMapping({}, node.position)
        if not isinstance(node, YamlMapping):
            raise self.fail(_show_node(node))
        values = {**extra, **ck.section(node, self.pattern, path)}
        if self.finish is not None:
            values = self.finish(ck, values, path)
        if _INVALID in values.values():
            return _INVALID
        return self.cls(**values)

    def dump(self, value: Any) -> Any:
        return _dump(value, self.pattern)


class _Groups(_Section):
    """Named sections: `groups: {name: {...}}`, in file order."""

    NAME = re.compile(r"[a-z][a-z0-9_-]*")

    def check(self, ck: _Checker, node: YamlNode, path: YamlPath) -> Any:
        if isinstance(node, YamlScalar) and node.value is None:
            node = YamlMapping({}, node.position)
        if not isinstance(node, YamlMapping):
            raise self.fail(_show_node(node))
        if not node.entries:
            raise _Invalid("define at least one group")
        groups: dict[str, Any] = {}
        for name, entry in node.entries.items():
            groups[name] = ck.guard(self.build, entry.node, (*path, name), {"name": name})
            if not self.NAME.fullmatch(name):
                message = f"group name {name!r} must match ^[a-z][a-z0-9_-]*$"
                ck.error(entry.key_position, (*path, name), message)
                groups[name] = _INVALID
        return _INVALID if _INVALID in groups.values() else MappingProxyType(groups)

    def dump(self, value: Any) -> Any:
        return {name: _dump(group, self.pattern) for name, group in value.items()}


class _Rules(_Section):
    """A list of sections: `rules: [{...}, ...]`."""

    def check(self, ck: _Checker, node: YamlNode, path: YamlPath) -> Any:
        if not isinstance(node, YamlSequence):
            raise _Invalid(f"expected a list, got {_show_node(node)}")
        rules = [ck.guard(self.build, item, (*path, i), {}) for i, item in enumerate(node.items)]
        return _INVALID if _INVALID in rules else tuple(rules)

    def dump(self, value: Any) -> Any:
        return [_dump(rule, self.pattern) for rule in value]


_Finish = Callable[["_Checker", dict[str, Any], YamlPath], dict[str, Any]]


# --- the schema -------------------------------------------------------------------

_REQUIRED: Any = object()
_SAME: Any = object()


@dataclass(frozen=True)
class Setting:
    #: Dotted YAML path; `*` stands for any group name, `[]` for any list item.
    path: str
    kind: _Kind
    #: The default as written in YAML (`"30s"`), parsed like user input.
    default: Any
    reload: Reload | None
    #: One sentence for the example file.
    doc: str = ""
    nullable: bool = False
    #: What the example file shows, when not the default.
    example: Any = _SAME
    #: Shown commented out in the example: an alternative to a sibling.
    alternative: bool = False

    @property
    def key(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def parent(self) -> str:
        return self.path.rpartition(".")[0]

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def _finish_database(ck: _Checker, v: dict[str, Any], path: YamlPath) -> dict[str, Any]:
    sources = [k for k in ("path", "dsn", "dsn_file") if v[k] is not None]
    if not sources:
        ck.error_at(path, "set one of path (SQLite), dsn or dsn_file (Postgres)")
        v["path"] = _INVALID
    for extra in sources[1:]:
        ck.error_at((*path, extra), f"{sources[0]} and {extra} are both set; keep one")
        v[extra] = _INVALID
    if isinstance(v["dsn_file"], str):
        v["dsn"] = ck.read_secret((*path, "dsn_file"), v["dsn_file"])
    if isinstance(v["path"], str):
        ck.check_sqlite_dir((*path, "path"), v["path"])
    if v["auto_migrate"] is None:
        v["auto_migrate"] = v["path"] is not None
    return v


def _finish_group(ck: _Checker, v: dict[str, Any], path: YamlPath) -> dict[str, Any]:
    low, high = v["retry_backoff"], v["retry_backoff_max"]
    if _INVALID not in (low, high) and high < low:
        message = f"must be at least retry_backoff ({format_duration(low)})"
        ck.error_at((*path, "retry_backoff_max"), message)
        v["retry_backoff_max"] = _INVALID
    return v


def _finish_retention(ck: _Checker, v: dict[str, Any], path: YamlPath) -> dict[str, Any]:
    rules = v["rules"]
    if rules is not _INVALID:
        if not rules:
            ck.warn_at((*path, "rules"), "is empty: finished tasks are never purged")
        _check_rule_shadowing(ck, rules, (*path, "rules"))
    return v


def _finish_root(ck: _Checker, v: dict[str, Any], path: YamlPath) -> dict[str, Any]:
    database, groups = v["database"], v["groups"]
    if groups is not _INVALID and v["handlers"] is not _INVALID:
        groups = v["groups"] = ck.inherit_handlers(groups, v["handlers"])
    if groups is not _INVALID and v["shutdown_timeout"] is not _INVALID:
        ck.warn_max_run(groups, v["shutdown_timeout"])
    retention = v["retention"]
    # The default batch depends on the backend, known only now.
    no_batch = isinstance(retention, RetentionConfig) and retention.batch is None
    if no_batch and isinstance(database, DatabaseConfig):
        batch = 500 if database.backend == "sqlite" else 1000
        v["retention"] = replace(retention, batch=batch)
    if v["runtime_dir"] is None:
        v["runtime_dir"] = _default_runtime_dir(ck.env)
    metrics = v["metrics"]
    if metrics is not _INVALID and metrics.listen is not None and not metrics.listen.is_loopback:
        ck.warn_at(("metrics", "listen"), f"serves metrics beyond this host on {metrics.listen}")
    return v


def _default_runtime_dir(env: Mapping[str, str]) -> str:
    if env.get("RUNTIME_DIRECTORY"):  # systemd's RuntimeDirectory=, maybe several
        return env["RUNTIME_DIRECTORY"].split(":")[0]
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "cairnqd")
    return f"/tmp/cairnqd-{os.getuid()}"


_QUEUE = _Str(r"[^\s\x00-\x1f]+", "a queue name without spaces")
_RESOURCE = _Str(r"[A-Za-z_][A-Za-z0-9_.-]*", "a name like gpu or db_writer")
_LOGGER = _Str(r"[A-Za-z0-9_.-]+", "a logger name")
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_R, _H, _S, _L = Reload.RESTART, Reload.HOT, Reload.SIZE, Reload.ROLL
_DEFAULT_RULES = [
    {"status": "succeeded", "older_than": "7d"},
    {"status": "canceled", "older_than": "7d"},
    {"status": "failed", "older_than": "30d"},
]
# DAEMON.md §6 buckets, in seconds.
_DURATION_BUCKETS = [
    0.005, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600
]  # fmt: skip
_WAIT_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800]
_EXAMPLE_GROUPS = {
    "default": {"queues": ["default"]},
    "slow": {"queues": ["slow"], "concurrency": 2, "lease": "1m", "max_run": "30s"},
}

# One line of facts, one of documentation (rendered into the example file).
# fmt: off
SCHEMA: tuple[Setting, ...] = (
    Setting("version", _Version(), _REQUIRED, None, example=1, doc=
            "Config format version; required."),
    Setting("database", _Section(DatabaseConfig, _finish_database), {}, None,
            "Where the tasks live."),
    Setting("database.path", _Path(), None, _R, nullable=True, example="./cairnq.db", doc=
            "SQLite database file (created if missing); set exactly one of path, dsn, dsn_file."),
    Setting("database.dsn", _Dsn(), None, _R, nullable=True, alternative=True,
            example="postgresql://cairnq@localhost/cairnq", doc=
            "Postgres connection string (postgresql://user:pass@host/db or key=value pairs); "
            "its password is never logged."),
    Setting("database.dsn_file", _Path(), None, _R, nullable=True, alternative=True,
            example="${CREDENTIALS_DIRECTORY}/cairnq-dsn", doc=
            "File holding the Postgres DSN, read by the parent, trailing newline stripped; "
            "with systemd's LoadCredential= use ${CREDENTIALS_DIRECTORY}/<name>."),
    Setting("database.connect_timeout", _Duration("1s"), "10s", _L,
            "Give up on one connection attempt after this long."),
    Setting("database.busy_timeout", _Duration("1ms"), "5s", _L,
            "SQLite: how long a writer waits for the database lock."),
    Setting("database.connections_per_child", _Int(1), 1, _L,
            "Database connections each child opens."),
    Setting("database.expected_hosts", _Int(1), 1, _H,
            "Hosts running cairnqd on this database, for the Postgres connection budget."),
    Setting("database.connection_check", _Enum("refuse", "warn", "off"), "refuse", _H,
            "When the Postgres connection budget exceeds the server's limits: refuse to "
            "start, warn, or off (behind a pooler)."),
    Setting("database.auto_migrate", _Bool(), None, _H, nullable=True, doc=
            "Apply pending migrations at startup; null: true on SQLite, false on Postgres."),
    Setting("database.lock_namespace", _Int(-(2**31), 2**31 - 1), 0x63716E64, _R,
            "First key of the Postgres advisory locks for purge and stats leadership "
            "(0x63716e64); the same on every host."),
    Setting("handlers", _List(_HandlerPath()), [], _L, example=["cairnqd.demo:registry"], doc=
            "Handler registries for every group: module:attribute of a cairnqd TaskRegistry "
            "or of a cairnq Worker."),
    Setting("groups", _Groups(GroupConfig, _finish_group), _REQUIRED, None,
            example=_EXAMPLE_GROUPS, doc=
            "Pools of identical worker processes, by name (^[a-z][a-z0-9_-]*$); at least one."),
    Setting("groups.*.queues", _List(_QUEUE, non_empty=True), _REQUIRED, _L,
            "Queues this group claims from; groups may share a queue."),
    Setting("groups.*.handlers", _List(_HandlerPath()), None, _L, nullable=True, doc=
            "Handler registries for this group, replacing the top-level list; null inherits it."),
    Setting("groups.*.processes", _Int(1), 1, _S,
            "Child processes in the pool."),
    Setting("groups.*.concurrency", _Int(1), 4, _L,
            "Tasks in flight per child."),
    Setting("groups.*.prefetch", _Prefetch(), "auto", _L,
            "Tasks each child claims beyond its free slots: auto sizes it from the "
            "handlers' pace; 0 claims only free slots."),
    Setting("groups.*.lease", _Duration("1s"), "30s", _L,
            "Task lease; children renew it every lease/3."),
    Setting("groups.*.max_run", _Duration("1s"), None, _L, nullable=True, doc=
            "Abort an attempt that runs longer than this; null: no limit."),
    Setting("groups.*.max_tasks_per_child", _Int(1), None, _L, nullable=True, doc=
            "Replace a child after about this many tasks (up to 10% jitter); null: never."),
    Setting("groups.*.max_memory", _Size(), None, _L, nullable=True, doc=
            "Replace a child whose RSS exceeds this, checked between tasks; null: no limit."),
    Setting("groups.*.shutdown_timeout", _Duration(), None, _L, nullable=True, doc=
            "How long this group's children may drain; null: the top-level shutdown_timeout."),
    Setting("groups.*.poll_interval", _Duration("10ms"), "1s", _L,
            "Idle children look for new tasks this often."),
    Setting("groups.*.retry_backoff", _Duration(), "1s", _L,
            "Retry delay after a first failed attempt; doubles per attempt, with jitter."),
    Setting("groups.*.retry_backoff_max", _Duration(), "30s", _L,
            "Ceiling of the retry delay."),
    Setting("groups.*.resources", _Map(_RESOURCE, _Int(1)), {}, _L,
            "Shared ceilings that handlers registered with resource= draw from, e.g. {gpu: 1}."),
    Setting("shutdown_timeout", _Duration(), "30s", _H,
            "On TERM, how long children may finish in-flight tasks before they are stopped "
            "and their tasks handed back."),
    Setting("metrics", _Section(MetricsConfig), {}, None,
            "Prometheus metrics, served by the parent."),
    Setting("metrics.listen", _Listen(), "127.0.0.1:9464", _R,
            "host:port to serve /metrics on (port 0 picks a free one), or off."),
    Setting("metrics.stats_ttl", _Duration(), "10s", _H,
            "Reuse the database statistics for this long across scrapes."),
    Setting("metrics.queue_stats", _Enum("all", "leader"), "all", _H,
            "Hosts that export per-queue database gauges: all, or one leader (Postgres)."),
    Setting("metrics.task_name_label", _Bool(), False, _H,
            "Label task counters with the task name too."),
    Setting("metrics.duration_buckets", _Buckets(), _DURATION_BUCKETS, _H,
            "Histogram bounds of task durations, in seconds."),
    Setting("metrics.wait_buckets", _Buckets(), _WAIT_BUCKETS, _H,
            "Histogram bounds of queue waits, in seconds."),
    Setting("retention", _Section(RetentionConfig, _finish_retention), {}, None,
            "Purging of finished tasks."),
    Setting("retention.interval", _Duration("1s"), "10m", _H,
            "Time between purge sweeps; the first runs one interval after startup."),
    Setting("retention.batch", _Int(1), None, _H, nullable=True, doc=
            "Tasks deleted per purge transaction; null: 500 on SQLite, 1000 on Postgres."),
    Setting("retention.max_batches", _Int(1), 100, _H,
            "Batches per rule per sweep; the rest waits for the next sweep."),
    Setting("retention.rules", _Rules(PurgeRule), _DEFAULT_RULES, _H,
            "Purge rules. A task is kept for the shortest rule that matches it, so a rule "
            "inside a shorter one is an error; [] disables purging."),
    Setting("retention.rules[].older_than", _Duration(), _REQUIRED, _H,
            "delete tasks finished longer ago than this (required)"),
    Setting("retention.rules[].status", _Enum("succeeded", "failed", "canceled"), None, _H,
            nullable=True, doc="only tasks that ended so"),
    Setting("retention.rules[].queue", _QUEUE, None, _H, nullable=True, doc=
            "only this queue"),
    Setting("retention.rules[].name", _Str(), None, _H, nullable=True, doc=
            "only this task name"),
    Setting("reaper", _Section(ReaperConfig), {}, None,
            "Recovery of expired leases."),
    Setting("reaper.interval", _Duration("1s"), "15s", _H,
            "Recover expired leases this often, also on queues no child polls."),
    Setting("supervisor", _Section(SupervisorConfig), {}, None,
            "How the parent restarts children that die."),
    Setting("supervisor.restart_budget", _Int(1), 10, _H,
            "Crash restarts a group may spend per restart_window before crashloop."),
    Setting("supervisor.restart_window", _Duration("1s"), "5m", _H,
            "The sliding window restart_budget is counted over."),
    Setting("supervisor.backoff_max", _Duration("100ms"), "60s", _H,
            "Cap of a slot's restart delay (1s doubling per consecutive crash, jittered)."),
    Setting("supervisor.boot_timeout", _Duration("1s"), "60s", _H,
            "A child not ready this long after spawning is killed (db_wait excluded)."),
    Setting("supervisor.heartbeat_timeout", _Duration("1s"), "30s", _H,
            "A ready child silent this long is aborted (SIGABRT, then SIGKILL)."),
    Setting("supervisor.heartbeat_interval", _Duration("100ms"), "5s", _H,
            "How often each child reports its state and memory."),
    Setting("reload", _Section(ReloadConfig), {}, None,
            "Rolling restarts on reload."),
    Setting("reload.max_surge", _Int(1), 1, _H,
            "Extra children a group may run while it rolls."),
    Setting("logging", _Section(LoggingConfig), {}, None,
            "Logs go to stderr (the journal under systemd)."),
    Setting("logging.level", _Enum(*_LEVELS, fold=True), "info", _H,
            "debug, info, warning, error or critical."),
    Setting("logging.format", _Enum("text", "json"), "text", _H,
            "text, or json: one object per line."),
    Setting("logging.file", _Path(), None, _H, nullable=True, doc=
            "Append logs to this file instead of stderr (SIGUSR1 reopens it); null: stderr."),
    Setting("logging.loggers", _Map(_LOGGER, _Enum(*_LEVELS, fold=True)), {}, _H,
            "Levels of single loggers, e.g. {psycopg: warning}."),
    Setting("runtime_dir", _Path(), None, _R, nullable=True, doc=
            "Directory of the state file; null: $RUNTIME_DIRECTORY, else "
            "$XDG_RUNTIME_DIR/cairnqd, else /tmp/cairnqd-<uid>."),
)
# fmt: on


def _section_pattern(setting: Setting) -> str:
    if isinstance(setting.kind, _Groups):
        return setting.path + ".*"
    if isinstance(setting.kind, _Rules):
        return setting.path + "[]"
    return setting.path


def _index_schema() -> tuple[dict[str, list[Setting]], dict[str, Setting]]:
    children: dict[str, list[Setting]] = {"": []}
    by_path: dict[str, Setting] = {}
    for setting in SCHEMA:
        by_path[setting.path] = setting
        children.setdefault(setting.parent, []).append(setting)
        if isinstance(setting.kind, _Section):
            setting.kind.pattern = _section_pattern(setting)
            children.setdefault(setting.kind.pattern, [])
    return children, by_path


_CHILDREN, _BY_PATH = _index_schema()
_ROOT = _Section(Config, _finish_root)


def _children(pattern: str) -> list[Setting]:
    return _CHILDREN[pattern]


def _dump(obj: Any, pattern: str | None = None) -> dict[str, Any]:
    """A built section as YAML-level values, driven by the schema."""
    if pattern is None:
        pattern = _PATTERN_OF[type(obj)]
    data: dict[str, Any] = {}
    for setting in _children(pattern):
        value = getattr(obj, setting.key)
        # None is "not set" for a nullable setting, but may mean more (listen: off).
        null = value is None and setting.nullable
        data[setting.key] = None if null else setting.kind.dump(value)
    return data


_PATTERN_OF: dict[type, str] = {Config: ""} | {
    s.kind.cls: s.kind.pattern for s in SCHEMA if isinstance(s.kind, _Section)
}


# --- checking ---------------------------------------------------------------------


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
        _suggest(key, known) or f" (expected one of: {', '.join(known)})"
    )


class _Checker:
    """Collects problems while the schema walks the document."""

    def __init__(self, root: YamlNode, env: Mapping[str, str]) -> None:
        self.root = root
        self.env = env
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
        `_INVALID`."""
        if path in self.lost:
            return _INVALID
        try:
            return check(self, node, path, *args)
        except _Invalid as exc:
            self.error((exc.node or node).position, (*path, *exc.suffix), exc.message)
            return _INVALID

    def value(self, kind: _Kind, node: YamlNode, path: YamlPath) -> Any:
        return self.guard(kind.check, node, path)

    def setting(self, setting: Setting, node: YamlNode, path: YamlPath) -> Any:
        if setting.nullable and isinstance(node, YamlScalar) and node.value is None:
            return None
        return self.value(setting.kind, node, path)

    def section(self, node: YamlMapping, pattern: str, path: YamlPath) -> dict[str, Any]:
        settings = _children(pattern)
        keys = [s.key for s in settings]
        for key, written in node.entries.items():
            if key not in keys:
                self.error(written.key_position, (*path, key), _unknown_key(key, keys))
        values: dict[str, Any] = {}
        for setting in settings:
            entry = node.entries.get(setting.key)
            if entry is None and setting.required:
                self.error(node.position, path, f"missing required key {setting.key!r}")
                values[setting.key] = _INVALID
                continue
            child = _synthetic(setting.default, node.position) if entry is None else entry.node
            values[setting.key] = self.setting(setting, child, (*path, setting.key))
        return values

    # -- cross-field checks that need the outside world

    def read_secret(self, path: YamlPath, filename: str) -> Any:
        try:
            with open(filename, encoding="utf-8") as f:
                text = f.read().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
            self.error_at(path, f"cannot read {filename}: {reason or exc}")
            return _INVALID
        problem = "is empty" if not text.strip() else _dsn_problem(text)
        if problem:
            self.error_at(path, f"{filename} does not hold a DSN: {problem}")
            return _INVALID
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
                return _INVALID
            result[name] = replace(group, handlers=handlers)
        return MappingProxyType(result)

    def warn_max_run(self, groups: Mapping[str, GroupConfig], shutdown: timedelta) -> None:
        for name, group in groups.items():
            limit = group.shutdown_timeout or shutdown
            if group.max_run is not None and group.max_run > limit:
                self.warn_at(
                    ("groups", name, "max_run"),
                    f"{format_duration(group.max_run)} is longer than the shutdown_timeout "
                    f"of {format_duration(limit)}: a task cut off by a shutdown spends an "
                    "attempt, and fails if it was its last",
                )


def _covers(a: PurgeRule, b: PurgeRule) -> bool:
    """Every task `b` matches, `a` matches too."""
    pairs = zip(a.filters(), b.filters(), strict=True)
    return all(fa is None or fa == fb for (_, fa), (_, fb) in pairs)


def _overlaps(a: PurgeRule, b: PurgeRule) -> bool:
    pairs = zip(a.filters(), b.filters(), strict=True)
    return all(fa is None or fb is None or fa == fb for (_, fa), (_, fb) in pairs)


def _shadows(a: PurgeRule, i: int, b: PurgeRule, j: int) -> bool:
    """Rule i deletes everything rule j would, no later than j would. Of two
    identical rules, the later one is the redundant one."""
    if not _covers(a, b) or a.older_than > b.older_than:
        return False
    return a.older_than < b.older_than or not _covers(b, a) or i < j


def _check_rule_shadowing(ck: _Checker, rules: tuple[PurgeRule, ...], path: YamlPath) -> None:
    """DAEMON.md §5: a task's retention is the minimum over matching rules, and
    filters cannot exclude, so a rule inside a shorter one can never fire."""
    for j, rule in enumerate(rules):
        shadow = next((i for i, a in enumerate(rules) if i != j and _shadows(a, i, rule, j)), None)
        if shadow is not None:
            other = format_path((*path, shadow))
            ck.error_at(
                (*path, j),
                f"never deletes anything: {other} ({rules[shadow].describe()}) "
                "removes those tasks first",
            )
            continue
        for i, earlier in enumerate(rules[:j]):
            nested = _covers(earlier, rule) or _covers(rule, earlier)
            partial = _overlaps(earlier, rule) and not nested
            if partial and earlier.older_than != rule.older_than:
                _warn_overlap(ck, path, (i, earlier), (j, rule))


def _warn_overlap(
    ck: _Checker, path: YamlPath, a: tuple[int, PurgeRule], b: tuple[int, PurgeRule]
) -> None:
    """Tasks matching both rules get the shorter retention; say so at the longer one,
    whose author probably expected otherwise."""
    (longer_index, _), (shorter_index, shorter) = sorted(
        (a, b), key=lambda pair: pair[1].older_than, reverse=True
    )
    other = format_path((*path, shorter_index))
    ck.warn_at(
        (*path, longer_index),
        f"tasks also matched by {other} ({shorter.describe()}) are deleted after "
        f"{format_duration(shorter.older_than)}",
    )


# --- loading ----------------------------------------------------------------------


def _by_position(problem: ConfigProblem) -> tuple[str, int, int]:
    return problem.file, problem.line, problem.col


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Config:
    """Read, interpolate and validate a config file.

    Raises ConfigError with every problem found. `env` (default `os.environ`) feeds
    `${VAR}` interpolation and the default `runtime_dir`."""
    filename = os.fspath(path)
    environ = os.environ if env is None else env
    try:
        document = load_yaml(filename)
    except OSError as exc:
        message = f"cannot read the config file: {exc.strerror or exc}"
        raise ConfigError([ConfigProblem(filename, 0, 0, "", message)]) from None
    except YamlSyntaxError as exc:
        at = exc.position
        raise ConfigError([ConfigProblem(at.file, at.line, at.col, "", exc.message)]) from None
    root, interpolation_problems = interpolate(document.root, environ)
    ck = _Checker(root, environ)
    for problem in (*document.problems, *interpolation_problems):
        ck.error(problem.position, problem.path, problem.message)
        if problem.value_lost:
            ck.lost.add(problem.path)
    config = ck.guard(_ROOT.check, root, ())
    # Stable, so problems at one position keep schema order.
    warnings = sorted(ck.warnings, key=_by_position)
    if ck.problems or config is _INVALID:
        raise ConfigError(sorted(ck.problems, key=_by_position), warnings)
    assert isinstance(config, Config)
    return replace(config, source=filename, warnings=tuple(warnings))


# --- reload diff ------------------------------------------------------------------


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


def _reload_of(path: str) -> Reload:
    parts = path.split(".")
    if parts[0] == "groups" and len(parts) > 2:
        parts[1] = "*"
    while parts:
        setting = _BY_PATH.get(".".join(parts))
        if setting is not None and setting.reload is not None:
            return setting.reload
        parts.pop()
    return Reload.RESTART


def diff_configs(old: Config, new: Config) -> list[ConfigChange]:
    """Changed settings, in schema order; an added or removed group is one change."""
    before, after = dict(_flatten(_dump(old))), dict(_flatten(_dump(new)))
    moved = [g for g in (*old.groups, *new.groups) if (g in old.groups) != (g in new.groups)]
    changes = [ConfigChange(f"groups.{name}", Reload.ROLL) for name in moved]
    missing = object()
    for path in dict.fromkeys([*before, *after]):
        parts = path.split(".")
        if parts[0] == "groups" and parts[1] in moved:
            continue
        if before.get(path, missing) != after.get(path, missing):
            changes.append(ConfigChange(path, _reload_of(path)))
    return changes


# --- the example file -------------------------------------------------------------

_TAGS = {Reload.RESTART: "restart", Reload.HOT: "hot", Reload.SIZE: "resize", Reload.ROLL: "roll"}
_HEADER = """\
cairnqd configuration. Every key is listed with its default, except where this
example sets its own value. Generated by cairnqd.config.render_example(); edit the
schema there, then run: python -m cairnqd.config > config/cairnq.example.yaml

Durations: 250ms, 30s, 5m, 1h, 7d or combined as 1h30m; a bare number is an error.
Sizes: 512MiB, 1GiB, 500MB. Strings may use ${VAR}, ${VAR:-default}, ${VAR-default}
or ${VAR:?message} from the environment; $$ is a literal $.
On reload (SIGHUP): [hot] applies in place, [resize] resizes the group, [roll]
replaces the group's children one at a time, [restart] is refused until a restart.
"""
_PLAIN = re.compile(r"[A-Za-z0-9_./~][A-Za-z0-9_./~@+-]*")


def _flow(value: Any) -> str:
    """A value as a one-line YAML flow node that our loader reads back unchanged."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, str):
        plain = _PLAIN.fullmatch(value) and value.lower() not in _YAML11_BOOLS
        return value if plain and _reads_as_string(value) else json.dumps(value)
    return _show(value)


def _reads_as_string(text: str) -> bool:
    return resolve_plain(text) == text


def _comment(text: str, indent: str) -> list[str]:
    return textwrap.wrap(
        text, width=88, initial_indent=indent + "# ", subsequent_indent=indent + "# "
    )


def _describe(setting: Setting, shown: Any) -> str:
    text = setting.doc
    if setting.reload is not None:
        text = f"[{_TAGS[setting.reload]}] {text}"
    if setting.default not in (None, _REQUIRED) and shown != setting.default:
        text += f" Default: {_flow(setting.default)}."
    return text


def _render(setting: Setting, shown: Any, indent: str, documented: bool = True) -> list[str]:
    lines = _comment(_describe(setting, shown), indent) if documented else []
    kind, key = setting.kind, setting.key
    if isinstance(kind, _Groups):
        return [*lines, f"{key}:", *_render_groups(kind, shown, indent + "  ")]
    if isinstance(kind, _Rules):
        fields_doc = "; ".join(f"{s.key}: {s.doc}" for s in _children(kind.pattern))
        items = [f"{indent}  - {_flow(rule)}" for rule in shown]
        return (
            lines + _comment(f"Each rule has {fields_doc}.", indent) + [f"{indent}{key}:", *items]
        )
    if isinstance(kind, _Section):
        return [*lines, f"{indent}{key}:", *_render_section(kind.pattern, shown, indent + "  ")]
    prefix = "# " if setting.alternative else ""
    return [*lines, f"{indent}{prefix}{key}: {_flow(shown)}"]


def _shown(setting: Setting, overrides: Mapping[str, Any] | None = None) -> Any:
    if overrides is not None and setting.key in overrides:
        return overrides[setting.key]
    return setting.default if setting.example is _SAME else setting.example


def _render_section(pattern: str, overrides: Mapping[str, Any], indent: str) -> list[str]:
    lines: list[str] = []
    for setting in _children(pattern):
        lines += _render(setting, _shown(setting, overrides), indent)
    return lines


def _render_groups(kind: _Groups, groups: Mapping[str, Any], indent: str) -> list[str]:
    """The first group shows every key; the others only what they change."""
    lines: list[str] = []
    for index, (name, overrides) in enumerate(groups.items()):
        if index == 1:
            lines += _comment("Another group: only what differs from the defaults.", indent)
        lines.append(f"{indent}{name}:")
        for setting in _children(kind.pattern):
            if index == 0 or setting.key in overrides:
                shown = overrides.get(setting.key, setting.default)
                lines += _render(setting, shown, indent + "  ", documented=index == 0)
    return lines


def render_example() -> str:
    """The text of config/cairnq.example.yaml."""
    lines = [("# " + line).rstrip() for line in _HEADER.splitlines()]
    for setting in _children(""):
        lines += ["", *_render(setting, _shown(setting), "")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_example(), end="")
