"""`Config`, the whole validated config, with the views the schema drives: the
redacted dump and the per-group fingerprints a reload compares."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from cairnqd.config.dsn import redact_dsn
from cairnqd.config.problems import ConfigProblem
from cairnqd.config.schema import Reload, child_settings, dump_section
from cairnqd.config.sections import (
    DashboardConfig,
    DatabaseConfig,
    GroupConfig,
    LimitConfig,
    LoggingConfig,
    MetricsConfig,
    ReaperConfig,
    ReloadConfig,
    RetentionConfig,
    ScheduleConfig,
    SupervisorConfig,
    TracingConfig,
)
from cairnqd.limits import Limit


@dataclass(frozen=True)
class Config:
    version: int
    database: DatabaseConfig
    handlers: tuple[str, ...]
    groups: Mapping[str, GroupConfig]
    schedules: Mapping[str, ScheduleConfig]
    limits: Mapping[str, LimitConfig]
    shutdown_timeout: timedelta
    metrics: MetricsConfig
    dashboard: DashboardConfig
    retention: RetentionConfig
    reaper: ReaperConfig
    supervisor: SupervisorConfig
    reload: ReloadConfig
    logging: LoggingConfig
    tracing: TracingConfig
    runtime_dir: str
    #: Absolute directories put first on sys.path in every child and handler probe.
    python_path: tuple[str, ...] = ()
    #: This daemon's name for operators; None: `instance_name()` makes one (host:pid).
    instance: str | None = None
    #: The file it was loaded from.
    source: str = field(default="", compare=False)
    #: Suspicious but usable settings, for `check` and the startup log.
    warnings: tuple[ConfigProblem, ...] = field(default=(), compare=False)

    def instance_name(self) -> str:
        """What this daemon calls itself on the dashboard: `instance`, or host:pid."""
        return self.instance or f"{socket.gethostname()}:{os.getpid()}"

    def flow_limits(self) -> tuple[Limit, ...]:
        """`limits:` as the workers keep them (docs/limits.md)."""
        return tuple(section.limit() for section in self.limits.values())

    def shutdown_timeout_for(self, group: str) -> timedelta:
        return self.groups[group].shutdown_timeout or self.shutdown_timeout

    def to_dict(self, *, redact: bool = True) -> dict[str, Any]:
        """The effective config as YAML-ready values. Unredacted, it loads back equal;
        redacted (`config dump`), DSN passwords and dsn_file contents read `***`."""
        data = dump_section(self, "")
        database = data["database"]
        if self.database.dsn_file is not None:
            database["dsn"] = "***" if redact else None
        elif redact and self.database.dsn is not None:
            database["dsn"] = redact_dsn(self.database.dsn)
        if self.database.direct_dsn_file is not None:
            database["direct_dsn"] = "***" if redact else None
        elif redact and self.database.direct_dsn is not None:
            database["direct_dsn"] = redact_dsn(self.database.direct_dsn)
        return data

    def redacted(self) -> dict[str, Any]:
        return self.to_dict(redact=True)

    def group_fingerprint(self, name: str) -> str:
        """SHA-256 of the canonical JSON of everything group `name`'s children start
        with, except `processes` (a size-only change) and `cancel_grace` (sent to the
        children in place). Equal fingerprints: no roll."""
        group = dump_section(self.groups[name])
        del group["processes"]
        del group["cancel_grace"]
        database = dump_section(self.database)
        child_db = {
            s.key: database[s.key] for s in child_settings("database") if s.reload is Reload.ROLL
        }
        started: dict[str, Any] = {
            "group": group,
            "database": child_db,
            # python_path decides which code the handler names import.
            "python_path": list(self.python_path),
        }
        if self.tracing.enabled:
            # Only when on, so turning it on or off rolls, and a config without it
            # keeps the fingerprints it always had.
            started["tracing"] = dump_section(self.tracing)
        canonical = json.dumps(
            started,
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()

    def fingerprints(self) -> dict[str, str]:
        return {name: self.group_fingerprint(name) for name in self.groups}
