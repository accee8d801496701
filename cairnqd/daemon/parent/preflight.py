"""The checks made once before any child exists, by the daemon and `cairnqd check --connect`.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal

from cairnqd.config import Config, redact_dsn, setting_position
from cairnqd.daemon.handler_probe import probe_handlers
from cairnqd.daemon.parent.connection_budget import describe_budget, over_budget
from cairnqd.errors import (
    DatabaseUnavailable,
    MigrationsPending,
    NotACairnqDatabase,
    ProtocolVersionMismatch,
    SchemaMismatch,
)
from cairnqd.store.errors import is_transient, refused_login
from cairnqd.store.factory import missing_sqlite_file, store_for

Level = Literal["ok", "warning", "problem"]


@dataclass(frozen=True)
class Finding:
    """One checked thing: `subject` names it (database, migrations, handlers,
    connections), `level` says whether it stops a start."""

    level: Level
    subject: str
    text: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.text}"


@dataclass
class Preflight:
    findings: list[Finding] = field(default_factory=list)
    #: The database could not be reached (the daemon waits; `check --connect` fails).
    unreachable: bool = False

    def add(self, level: Level, subject: str, text: str) -> None:
        self.findings.append(Finding(level, subject, text))

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "problem"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]


def run_preflight(config: Config, *, handlers: bool = True) -> Preflight:
    """Database, migrations, connection budget, and (with `handlers`) every group's
    handler imports, in a probe process set up as a child is."""
    report = Preflight()
    _check_database(config, report)
    if handlers:
        check_handlers(config, report)
    return report


def _where(config: Config) -> str:
    db = config.database
    return f"sqlite {db.path}" if db.path is not None else f"postgres {redact_dsn(db.dsn or '')}"


def _dsn_key(config: Config) -> str:
    """Where the DSN was configured: its key (database.dsn or database.dsn_file) and,
    when the file says, its position there."""
    key = "dsn_file" if config.database.dsn_file else "dsn"
    where = setting_position(config.source, ("database", key)) if config.source else None
    return f"database.{key}" + (f" at {where}" if where else "")


def _migrate_hint(config: Config) -> str:
    return f"run `cairnqd -c {config.source or 'FILE'} migrate`"


def _check_database(config: Config, report: Preflight) -> None:
    path = missing_sqlite_file(config.database)
    if path is not None:
        if config.database.auto_migrate:
            report.add("ok", "database", f"{path} does not exist yet: created at start")
        else:
            report.add("problem", "database", f"no database at {path}; {_migrate_hint(config)}")
        return
    try:
        pending, limits = asyncio.run(_inspect(config))
    except (NotACairnqDatabase, ProtocolVersionMismatch, SchemaMismatch) as exc:
        report.add("problem", "database", _one_line(exc))
        return
    except Exception as exc:
        if not (isinstance(exc, DatabaseUnavailable) or is_transient(exc)):
            raise
        if (reason := refused_login(exc)) is not None:
            report.add(
                "problem",
                "database",
                f"{_where(config)} refused the connection: {reason}; no retry can fix "
                f"that: correct {_dsn_key(config)}",
            )
            return
        report.unreachable = True
        text = f"{_where(config)} cannot be reached: {_one_line(exc)}"
        report.add("warning", "database", text)
        return
    report.add("ok", "database", f"{_where(config)} reachable")
    if pending is None:
        report.add("ok", "migrations", "none pending")
    elif config.database.auto_migrate:
        text = f"{_pending_text(pending.names)}: applied at start (auto_migrate)"
        report.add("ok", "migrations", text)
    else:
        text = f"database has {_pending_text(pending.names)}; {_migrate_hint(config)}"
        report.add("problem", "migrations", text)
    if limits is not None:
        _check_budget(config, report, *limits)


def _pending_text(names: list[str]) -> str:
    # A fresh database lacks every migration: name the first and the last, not all.
    shown = ", ".join(names) if len(names) <= 3 else f"{names[0]} … {names[-1]}"
    return f"{len(names)} pending migration(s) ({shown})"


async def _inspect(config: Config) -> tuple[MigrationsPending | None, tuple[int, int] | None]:
    """The server's connection limits (Postgres), then a connect without migrating, in
    which the store checks the installation, pending migrations and the protocol."""
    store = store_for(config.database, "background", migrate=False)
    limits = await store.server_connection_limits()
    try:
        async with store:
            pass
    except MigrationsPending as exc:
        return exc, limits
    return None, limits


def _check_budget(config: Config, report: Preflight, limit: int, reserved: int) -> None:
    db = config.database
    if db.connection_check == "off":
        report.add("ok", "connections", "not checked (database.connection_check: off)")
        return
    message = over_budget(config, limit, reserved)
    if message is None:
        report.add("ok", "connections", describe_budget(config, limit, reserved))
    else:
        report.add(
            "problem" if db.connection_check == "refuse" else "warning", "connections", message
        )


def check_handlers(config: Config, report: Preflight) -> dict[str, set[str]]:
    """Each distinct registry list imported once; one finding per group. Returns the
    task names each group registers (none for a group whose import failed)."""
    lists = list(dict.fromkeys(g.handlers for g in config.groups.values()))
    timeout = config.supervisor.boot_timeout.total_seconds()
    results = dict(zip(lists, probe_handlers(config.python_path, lists, timeout), strict=True))
    names: dict[str, set[str]] = {}
    for group in config.groups.values():
        result = results[group.handlers]
        names[group.name] = set(result.names)
        if result.ok:
            listed = ", ".join(result.names) or "(none)"
            report.add("ok", "handlers", f"group {group.name}: handlers {listed}")
        else:
            report.add("problem", "handlers", f"group {group.name}: {result.error}")
    return names


def _one_line(exc: BaseException) -> str:
    # libpq's messages carry a tab-indented hint line; a log line gets one line.
    return " ".join(str(exc).split())
