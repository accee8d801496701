"""Cross-field checks, run once a section's own settings are read: what one setting
means depends on another, or on the backend, known only then."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from cairnqd.config.checks import Checks
from cairnqd.config.kinds import INVALID
from cairnqd.config.otel_parts import missing
from cairnqd.config.schedule_kinds import warn_unserved_queues
from cairnqd.config.sections import DatabaseConfig, RetentionConfig
from cairnqd.config.units import format_duration
from cairnqd.config.yamlload import YamlPath


def finish_database(ck: Checks, v: dict[str, Any], path: YamlPath) -> dict[str, Any]:
    sources = [k for k in ("path", "dsn", "dsn_file") if v[k] is not None]
    if not sources:
        ck.error_at(path, "set one of path (SQLite), dsn or dsn_file (Postgres)")
        v["path"] = INVALID
    for extra in sources[1:]:
        ck.error_at((*path, extra), f"{sources[0]} and {extra} are both set; keep one")
        v[extra] = INVALID
    if isinstance(v["dsn_file"], str):
        v["dsn"] = ck.read_secret((*path, "dsn_file"), v["dsn_file"])
    if isinstance(v["path"], str):
        ck.check_sqlite_dir((*path, "path"), v["path"])
    _finish_pooler(ck, v, path)
    if v["auto_migrate"] is None:
        v["auto_migrate"] = v["path"] is not None
    return v


def _finish_pooler(ck: Checks, v: dict[str, Any], path: YamlPath) -> None:
    """`direct_dsn`/`direct_dsn_file` and `pool_size` only mean something on Postgres,
    and `pool_size` only under a session pooler."""
    if v["direct_dsn"] is not None and v["direct_dsn_file"] is not None:
        message = "direct_dsn and direct_dsn_file are both set; keep one"
        ck.error_at((*path, "direct_dsn_file"), message)
        v["direct_dsn_file"] = INVALID
    elif isinstance(v["direct_dsn_file"], str):
        v["direct_dsn"] = ck.read_secret((*path, "direct_dsn_file"), v["direct_dsn_file"])
    postgres = v["path"] is None or v["path"] is INVALID  # unknown: no second error
    for key in ("direct_dsn", "direct_dsn_file", "pool_size"):
        if v[key] not in (None, INVALID) and not postgres:
            ck.error_at((*path, key), "applies to Postgres only (database.path is set)")
            v[key] = INVALID
    if v["pooler"] not in ("none", INVALID) and not postgres:
        ck.error_at((*path, "pooler"), "applies to Postgres only (database.path is set)")
        v["pooler"] = INVALID
    if v["pool_size"] not in (None, INVALID) and v["pooler"] != "session":
        ck.warn_at((*path, "pool_size"), "is only used with pooler: session")


def finish_group(ck: Checks, v: dict[str, Any], path: YamlPath) -> dict[str, Any]:
    low, high = v["retry_backoff"], v["retry_backoff_max"]
    if INVALID not in (low, high) and high < low:
        message = f"must be at least retry_backoff ({format_duration(low)})"
        ck.error_at((*path, "retry_backoff_max"), message)
        v["retry_backoff_max"] = INVALID
    lease, stall = v["lease"], v["stall_timeout"]
    if INVALID not in (lease, stall) and stall is not None and stall * 2 > lease:
        # The stalled child must be gone and its tasks handed back before the lease
        # it renewed last (up to lease/3 earlier) runs out.
        message = f"must be at most half the lease ({format_duration(lease)})"
        ck.error_at((*path, "stall_timeout"), message)
        v["stall_timeout"] = INVALID
    return v


#: The shortest dashboard token accepted: a guessable one is no protection.
DASHBOARD_TOKEN_MIN = 16
_DASHBOARD_TOKEN_MAX = 4096


def finish_dashboard(ck: Checks, v: dict[str, Any], path: YamlPath) -> dict[str, Any]:
    v["token"] = None
    if isinstance(v["token_file"], str):
        v["token"] = _read_token(ck, (*path, "token_file"), v["token_file"])
    listen, token_file = v["listen"], v["token_file"]
    beyond = listen is not INVALID and listen is not None and not listen.is_loopback
    if beyond and token_file is None:
        ck.error_at(
            (*path, "listen"),
            f"serves the dashboard beyond this host on {listen} without a login; "
            "set dashboard.token_file, or listen on 127.0.0.1",
        )
        v["listen"] = INVALID
    if v["actions"] is True and token_file is None:
        ck.error_at((*path, "actions"), "needs dashboard.token_file: actions require a login")
        v["actions"] = INVALID
    v["viewer_token"] = None
    if isinstance(v["viewer_token_file"], str):
        viewer_path = (*path, "viewer_token_file")
        if token_file is None:
            ck.error_at(viewer_path, "needs dashboard.token_file: a viewer logs in beside it")
            v["viewer_token_file"] = INVALID
        else:
            v["viewer_token"] = _read_token(ck, viewer_path, v["viewer_token_file"])
            if isinstance(v["token"], str) and v["viewer_token"] == v["token"]:
                same = "holds the same token as token_file: give viewers a token of their own"
                ck.error_at(viewer_path, same)
                v["viewer_token"] = INVALID
    return v


def _read_token(ck: Checks, path: YamlPath, filename: str) -> Any:
    try:
        with open(filename, encoding="utf-8") as f:
            text = f.read(_DASHBOARD_TOKEN_MAX + 1)
            mode = os.fstat(f.fileno()).st_mode
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
        ck.error_at(path, f"cannot read {filename}: {reason or exc}")
        return INVALID
    token = text.strip()
    if len(text) > _DASHBOARD_TOKEN_MAX:
        ck.error_at(path, f"{filename} is longer than {_DASHBOARD_TOKEN_MAX} characters")
        return INVALID
    if len(token) < DASHBOARD_TOKEN_MIN or any(c.isspace() for c in token):
        ck.error_at(
            path,
            f"{filename} must hold one token of at least {DASHBOARD_TOKEN_MIN} characters "
            "without spaces",
        )
        return INVALID
    if mode & 0o077:
        ck.warn_at(path, f"{filename} is readable by other users (mode {mode & 0o777:o})")
    return token


def finish_retention(ck: Checks, v: dict[str, Any], path: YamlPath) -> dict[str, Any]:
    # Rules against one another: `check_rule_shadowing`, run by the list itself, so
    # that it also compares the good rules of a list with a bad one.
    rules = v["rules"]
    if rules is not INVALID and not rules:
        ck.warn_at((*path, "rules"), "is empty: finished tasks are never purged")
    return v


def finish_supervisor(ck: Checks, v: dict[str, Any], path: YamlPath) -> dict[str, Any]:
    timeout, interval = v["heartbeat_timeout"], v["heartbeat_interval"]
    if INVALID not in (timeout, interval) and timeout <= interval:
        # A ready child is silent for up to an interval between two heartbeats, so
        # the parent would abort healthy children as silent.
        message = f"must be longer than heartbeat_interval ({format_duration(interval)})"
        ck.error_at((*path, "heartbeat_timeout"), message)
        v["heartbeat_timeout"] = INVALID
    return v


def finish_tracing(ck: Checks, v: dict[str, Any], path: YamlPath) -> dict[str, Any]:
    """`enabled: true` without the SDK or the exporter the environment names would
    leave every child unable to start: refused here, where the line is known."""
    if v["enabled"] is True:
        for problem in missing(ck.env):
            ck.error_at((*path, "enabled"), problem)
            v["enabled"] = INVALID
    return v


def finish_root(ck: Checks, v: dict[str, Any], path: YamlPath) -> dict[str, Any]:
    database, groups = v["database"], v["groups"]
    if groups is not INVALID and v["handlers"] is not INVALID:
        groups = v["groups"] = ck.inherit_handlers(groups, v["handlers"])
    if groups is not INVALID and v["shutdown_timeout"] is not INVALID:
        ck.warn_max_run(groups, v["shutdown_timeout"])
    warn_unserved_queues(ck, v["schedules"], groups)
    retention = v["retention"]
    # The default batch depends on the backend, known only now.
    no_batch = isinstance(retention, RetentionConfig) and retention.batch is None
    if no_batch and isinstance(database, DatabaseConfig):
        batch = 500 if database.backend == "sqlite" else 1000
        v["retention"] = replace(retention, batch=batch)
    if v["runtime_dir"] is None:
        v["runtime_dir"] = default_runtime_dir(ck.env)
    _warn_python_path(ck, v["python_path"])
    metrics = v["metrics"]
    if metrics is not INVALID and metrics.listen is not None and not metrics.listen.is_loopback:
        ck.warn_at(("metrics", "listen"), f"serves metrics beyond this host on {metrics.listen}")
    _check_listeners_apart(ck, metrics, v["dashboard"])
    return v


def _check_listeners_apart(ck: Checks, metrics: Any, dashboard: Any) -> None:
    """The metrics endpoint and the dashboard each bind their own socket: on one port
    (the same host, or either on every address) the second bind fails at start-up,
    after `check` had passed the file."""
    if INVALID in (metrics, dashboard) or metrics.listen is None or dashboard.listen is None:
        return
    a, b = metrics.listen, dashboard.listen
    if a is INVALID or b is INVALID or a.port != b.port or a.port == 0:
        return
    anywhere = ("0.0.0.0", "::", "")
    if a.host == b.host or a.host in anywhere or b.host in anywhere:
        ck.error_at(("dashboard", "listen"), f"{b} takes metrics.listen's port ({a})")


def finish_logging(ck: Checks, v: dict[str, Any], path: YamlPath) -> dict[str, Any]:
    """`logging.file` must be a file its directory can hold: the daemon refuses to start
    otherwise (it does not create the directory: a typo would scatter logs where nobody
    rotates them), so `check` refuses it too."""
    filename = v["file"]
    if not isinstance(filename, str):
        return v
    directory = os.path.dirname(filename) or "."
    if os.path.isdir(filename):
        ck.error_at((*path, "file"), f"{filename} is a directory")
        v["file"] = INVALID
    elif not os.path.isdir(directory):
        ck.error_at((*path, "file"), f"directory {directory} does not exist; create it first")
        v["file"] = INVALID
    return v


def _warn_python_path(ck: Checks, directories: Any) -> None:
    if directories is INVALID:
        return
    for i, directory in enumerate(directories):
        if not os.path.isdir(directory):
            ck.warn_at(("python_path", i), f"{directory} is not a directory")


def default_runtime_dir(env: Mapping[str, str]) -> str:
    if env.get("RUNTIME_DIRECTORY"):  # systemd's RuntimeDirectory=, maybe several
        return env["RUNTIME_DIRECTORY"].split(":")[0]
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "cairnqd")
    # A name any local user could create first: the daemon checks whose it is
    # (daemon/parent/runtimedir.py).
    temp = env.get("TMPDIR") or tempfile.gettempdir()
    return os.path.join(temp, f"cairnqd-{os.geteuid()}")
