"""The `boot` message: everything a child is told before it starts, built from the config.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from cairnqd.config.units import to_ms
from cairnqd.daemon.logs import logging_settings
from cairnqd.daemon.wire.messages import PROTOCOL_VERSION, MessageError, decode_fields, parse_line

if TYPE_CHECKING:  # a child decodes a boot and never loads the config schema
    from cairnqd.config import Config, DatabaseConfig, GroupConfig


@dataclass(frozen=True)
class WorkerSettings:
    """The SDK worker's options for one group."""

    queues: tuple[str, ...]
    #: `module:attribute` registries to import.
    handlers: tuple[str, ...]
    concurrency: int
    prefetch: int | Literal["auto"]
    lease_ms: int
    max_run_ms: int | None
    poll_interval_ms: int
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    resources: Mapping[str, int]
    #: `cancel_grace`: a canceled handler's time to return, then to stop.
    cancel_grace_ms: int = 10_000


@dataclass(frozen=True)
class DatabaseSettings:
    """Where the child's store connects, and how (see `store.factory.build_store`)."""

    path: str | None
    dsn: str | None
    busy_timeout_ms: int
    connect_timeout_s: float
    connections: int
    auto_migrate: bool
    #: `database.pooler`: none, session or transaction.
    pooler: str = "none"
    #: How wake-ups reach the child: listen (a LISTEN of its own), pipe (the parent's
    #: LISTEN on direct_dsn, passed on as `wake` messages) or off (polling only).
    push: str = "listen"


@dataclass(frozen=True)
class Boot:
    kind: ClassVar[Literal["boot"]] = "boot"
    #: The pipe protocol's version: a child of other code refuses to run (exit 78).
    v: int
    worker_id: str
    group: str
    slot: int
    nslots: int
    gen: int
    #: `logs.logging_settings()`: the child logs exactly as the parent does.
    logging: Mapping[str, Any]
    #: How often the heartbeat thread reports: often enough to see a stall in time.
    hb_interval_s: float
    #: A loop stalled this long gets the child aborted; the child reports its lag.
    stall_timeout_s: float
    #: Histogram bounds the child buckets task durations and waits into.
    duration_buckets: tuple[float, ...]
    wait_buckets: tuple[float, ...]
    shutdown_timeout_s: float
    #: This incarnation's task limit, jitter included; None: no limit.
    max_tasks: int | None
    #: Bytes of RSS; None: no limit.
    max_memory: int | None
    database: DatabaseSettings
    group_config: WorkerSettings
    #: The config's `python_path`, absolute: put first on sys.path before the handlers
    #: are imported (`handler_probe.use_python_path`), as `cairnqd check` does.
    python_path: tuple[str, ...]
    #: The config's `limits:`, as `Worker(limits=...)` takes them: every child keeps
    #: every limit (one that covers no queue of its group never comes into play).
    limits: Mapping[str, Any] = field(default_factory=dict)
    #: `tracing.enabled`: set up the OpenTelemetry SDK before the worker starts.
    tracing: bool = False
    #: The group's wake lock (daemon/wakerole.py): with push `listen`, only the child
    #: holding it answers wake-ups. None: every child does.
    wake_lock: str | None = None


def boot_for(
    config: Config,
    group: GroupConfig,
    slot: int,
    generation: int,
    worker_id: str,
    wake_lock: str | None = None,
) -> Boot:
    max_tasks = group.max_tasks_per_child
    if max_tasks:
        max_tasks += random.randint(0, max_tasks // 10)  # so a pool does not recycle at once
    return Boot(
        v=PROTOCOL_VERSION,
        worker_id=worker_id,
        group=group.name,
        slot=slot,
        nslots=group.processes,
        gen=generation,
        logging=logging_settings(config.logging),
        hb_interval_s=heartbeat_interval_s(config, group),
        stall_timeout_s=group.stall_bound.total_seconds(),
        duration_buckets=tuple(config.metrics.duration_buckets),
        wait_buckets=tuple(config.metrics.wait_buckets),
        shutdown_timeout_s=config.shutdown_timeout_for(group.name).total_seconds(),
        max_tasks=max_tasks,
        max_memory=group.max_memory,
        database=_database(config),
        group_config=_worker_settings(group),
        python_path=config.python_path,
        limits=limit_specs(config),
        tracing=config.tracing.enabled,
        wake_lock=wake_lock,
    )


def limit_specs(config: Config) -> dict[str, Any]:
    """`limits:` as plain data for the wire: each limit's keys that are set."""
    return {name: limit.spec() for name, limit in config.limits.items()}


def heartbeat_interval_s(config: Config, group: GroupConfig) -> float:
    """`supervisor.heartbeat_interval`, or a quarter of the group's stall bound if that
    is shorter: the parent must hear of a stalled loop well before the bound passes."""
    configured = config.supervisor.heartbeat_interval.total_seconds()
    return min(configured, group.stall_bound.total_seconds() / 4)


def _database(config: Config) -> DatabaseSettings:
    db = config.database
    return DatabaseSettings(
        path=db.path,
        dsn=db.dsn,
        busy_timeout_ms=to_ms(db.busy_timeout),
        connect_timeout_s=db.connect_timeout.total_seconds(),
        connections=db.connections_per_child,
        auto_migrate=bool(db.auto_migrate),
        pooler=db.pooler,
        push=child_push(db),
    )


def child_push(db: DatabaseConfig) -> str:
    """How a child's wake-ups arrive: through the parent when it holds the host's one
    LISTEN on `direct_dsn`, else a LISTEN of its own, except behind a transaction
    pooler, where LISTEN is deaf and the child polls."""
    if db.backend != "postgres":
        return "listen"
    if db.direct_dsn is not None:
        return "pipe"
    return "off" if db.pooler == "transaction" else "listen"


def _worker_settings(group: GroupConfig) -> WorkerSettings:
    return WorkerSettings(
        queues=group.queues,
        handlers=group.handlers,
        concurrency=group.concurrency,
        prefetch="auto" if group.prefetch == "auto" else int(group.prefetch),
        lease_ms=to_ms(group.lease),
        max_run_ms=to_ms(group.max_run) if group.max_run else None,
        poll_interval_ms=to_ms(group.poll_interval),
        retry_backoff_ms=to_ms(group.retry_backoff),
        retry_backoff_max_ms=to_ms(group.retry_backoff_max),
        resources=dict(group.resources),
        cancel_grace_ms=to_ms(group.cancel_grace),
    )


class BootVersionMismatch(MessageError):
    """The parent speaks another pipe protocol: it runs other code than ours."""


def decode_boot(line: bytes) -> Boot:
    """The child's reading of `boot`; MessageError for anything else."""
    data = parse_line(line)
    if data.get("t") != Boot.kind:
        raise MessageError(f"expected a boot message, got kind {data.get('t')!r}")
    if data.get("v") != PROTOCOL_VERSION:
        raise BootVersionMismatch(
            f"pipe protocol {data.get('v')!r}, this child speaks {PROTOCOL_VERSION}"
        )
    return decode_fields(Boot, data)
