"""The frozen dataclass of each config section, as `load_config` builds them."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from cairnqd.config.units import format_duration
from cairnqd.limits import Limit, parse_limit
from cairnqd.schedules import CronSlots, EverySlots, Misfire, Slots


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
    #: What sits between cairnqd and Postgres: none, or PgBouncer in session or
    #: transaction mode (docs/operations.md).
    pooler: str = "none"
    #: A non-pooled DSN (read from `direct_dsn_file` when that is set) for the parent's
    #: LISTEN, leadership and migrations behind a pooler. Never log it.
    direct_dsn: str | None = field(default=None, repr=False)
    direct_dsn_file: str | None = None
    #: Under `pooler: session`, the server connections the pooler has for this database.
    pool_size: int | None = None

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
    #: A child whose event loop stalls this long is aborted and its tasks handed
    #: back, before their leases can expire; None: a third of `lease`.
    stall_timeout: timedelta | None
    max_run: timedelta | None
    #: After a cancel: the handler's time to return, then to stop (applied hot).
    cancel_grace: timedelta
    max_tasks_per_child: int | None
    #: Bytes of RSS.
    max_memory: int | None
    #: None: the top-level `shutdown_timeout` (see `Config.shutdown_timeout_for`).
    shutdown_timeout: timedelta | None
    poll_interval: timedelta
    retry_backoff: timedelta
    retry_backoff_max: timedelta
    resources: Mapping[str, int]

    @property
    def stall_bound(self) -> timedelta:
        """`stall_timeout`, or its default: a third of the lease."""
        return self.stall_timeout if self.stall_timeout is not None else self.lease / 3


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
class DashboardConfig:
    #: None when `listen: off` (the default).
    listen: ListenAddress | None
    token_file: str | None
    actions: bool
    refresh: timedelta
    report: bool
    viewer_token_file: str | None
    search_scan: int
    #: The token read from `token_file`. Never log it or put it in a page.
    token: str | None = field(default=None, repr=False)
    #: The token read from `viewer_token_file`: a login that may look, never act.
    viewer_token: str | None = field(default=None, repr=False)


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
    fatal_cooldown: timedelta


@dataclass(frozen=True)
class ReloadConfig:
    max_surge: int
    upgrade_timeout: timedelta


@dataclass(frozen=True)
class LoggingConfig:
    level: str
    format: str
    file: str | None
    loggers: Mapping[str, str]


@dataclass(frozen=True)
class TracingConfig:
    #: Every worker child sets up the OpenTelemetry SDK from the `OTEL_*` environment.
    enabled: bool = False


# -- schedules (recurring tasks; docs/schedules.md) ----------------------------------------


@dataclass(frozen=True)
class ScheduleConfig:
    #: The schedule's own name: its key under `schedules:`, and part of each slot's key.
    schedule: str
    #: The task name each slot submits.
    name: str
    queue: str
    payload: Any
    priority: int
    max_attempts: int
    #: Exactly one of `cron` (five fields or a macro) and `every` is set.
    cron: str | None
    every: timedelta | None
    #: IANA zone the cron fields are read in; None: UTC.
    timezone: str | None
    jitter: timedelta
    misfire: Misfire
    enabled: bool

    def slots(self) -> Slots:
        if self.every is not None:
            return EverySlots(self.every)
        return CronSlots.parse(self.cron or "", self.timezone or "UTC")

    @property
    def rule(self) -> str:
        """The timing rule in one string; the scheduler stores it, so a changed rule
        starts from its next slot instead of catching up on the old one's."""
        if self.every is not None:
            return f"every {format_duration(self.every)}"
        return f"cron {self.cron} {self.timezone or 'UTC'}"


# -- limits (flow control; docs/limits.md) ------------------------------------------------


@dataclass(frozen=True)
class LimitConfig:
    #: The limit's name: its key under `limits:`.
    name: str
    queues: tuple[str, ...] | None
    names: tuple[str, ...] | None
    concurrency: int | None
    #: COUNT/DURATION, checked by `cairnqd.limits.parse_rate`.
    rate: str | None
    #: A payload field's dotted path, checked by `cairnqd.limits.parse_field`.
    partition_by: str | None

    def spec(self) -> dict[str, Any]:
        """The keys that are set, as `Worker(limits={name: spec})` takes them."""
        return {
            key: list(value) if isinstance(value, tuple) else value
            for key in ("queues", "names", "concurrency", "rate", "partition_by")
            if (value := getattr(self, key)) is not None
        }

    def limit(self) -> Limit:
        """The limit the workers keep."""
        return parse_limit(self.name, self.spec())
