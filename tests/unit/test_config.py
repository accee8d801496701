"""Config loading: every error kind with its exact position, defaults, secrets,
fingerprints, redaction, the reload diff, the example file and handler resolution."""

from __future__ import annotations

import dataclasses
import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from cairnqd import config as config_module
from cairnqd.config import (
    SCHEMA,
    Config,
    ConfigError,
    ListenAddress,
    Reload,
    diff_configs,
    format_duration,
    format_size,
    load_config,
    parse_duration,
    parse_size,
    redact_dsn,
    render_example,
    to_ms,
)
from cairnqd.config.reference import render_reference
from cairnqd.registry import HandlerError, TaskRegistry, parse_handler_path, resolve_handlers
from tests.support.configfiles import BASE, Errors, Loader

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config" / "cairnq.example.yaml"


def warnings_of(config: Config) -> list[str]:
    return [str(w).replace(config.source, "cairnq.yaml", 1) for w in config.warnings]


# --- the example file --------------------------------------------------------------


def test_example_file_is_generated_from_the_schema() -> None:
    assert EXAMPLE.read_text() == render_example(), (
        "config/cairnq.example.yaml is stale: python -m cairnqd.config > config/cairnq.example.yaml"
    )


def test_configuration_reference_is_generated_from_the_schema() -> None:
    reference = EXAMPLE.parent.parent / "docs" / "configuration.md"
    assert reference.read_text() == render_reference(), (
        "docs/configuration.md is stale: python -m cairnqd.config --reference > "
        "docs/configuration.md"
    )


def test_configuration_reference_lists_every_setting() -> None:
    text = render_reference()
    missing = [s.path for s in SCHEMA if f"`{s.path}`" not in text and "." in s.path]
    assert missing == []


def test_example_file_loads_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(EXAMPLE, env={})
    assert config.warnings == ()
    assert config.database.backend == "sqlite"
    # Relative to the example's own directory, not the working directory.
    assert config.database.path == str(EXAMPLE.parent.resolve() / "cairnq.db")
    assert list(config.groups) == ["default", "slow"]
    assert config.groups["slow"].queues == ("slow",)
    handlers = resolve_handlers(config.groups["default"].handlers)
    assert {"demo.echo", "demo.sleep", "demo.fail"} <= set(handlers)


def test_example_documents_every_key() -> None:
    text = render_example()
    for setting in SCHEMA:
        assert f"{setting.key}:" in text, setting.path


def test_schema_matches_the_dataclasses() -> None:
    """Every section's dataclass fields are exactly its schema keys (plus extras the
    loader fills itself), so building `cls(**values)` cannot drift."""
    extras = {
        "Config": {"source", "warnings"},
        "GroupConfig": {"name"},
        "ScheduleConfig": {"schedule"},
        "LimitConfig": {"name"},
        "DashboardConfig": {"token", "viewer_token"},
    }
    sections: dict[str, type] = {"": Config}
    for setting in SCHEMA:
        cls = getattr(setting.kind, "cls", None)
        if cls is not None:
            sections[setting.kind.pattern] = cls  # type: ignore[attr-defined]
    for pattern, cls in sections.items():
        keys = {s.key for s in SCHEMA if s.parent == pattern}
        names = {f.name for f in dataclasses.fields(cls)}
        assert names - extras.get(cls.__name__, set()) == keys, cls.__name__


def test_every_leaf_setting_has_a_reload_class_and_doc() -> None:
    for setting in SCHEMA:
        assert setting.doc, setting.path
        is_section = hasattr(setting.kind, "cls")
        if not is_section and setting.path != "version":
            assert isinstance(setting.reload, Reload), setting.path


# --- defaults ----------------------------------------------------------------------


def test_defaults_are_filled(load: Loader, tmp_path: Path) -> None:
    config = load(BASE, env={"XDG_RUNTIME_DIR": "/run/user/1000"})
    db = config.database
    assert (db.path, db.dsn, db.dsn_file) == (str(tmp_path / "t.db"), None, None)
    assert db.connect_timeout == timedelta(seconds=10)
    assert db.busy_timeout == timedelta(seconds=5)
    assert (db.connections_per_child, db.expected_hosts) == (1, 1)
    assert db.connection_check == "refuse"
    assert db.auto_migrate is True
    assert db.lock_namespace == 0x63716E64
    group = config.groups["default"]
    assert group.name == "default"
    assert group.handlers == ("cairnqd.demo:registry",)
    assert (group.processes, group.concurrency) == (1, 4)
    assert group.lease == timedelta(seconds=30)
    assert group.max_run is None and group.max_tasks_per_child is None
    assert group.max_memory is None and group.shutdown_timeout is None
    assert group.poll_interval == timedelta(seconds=1)
    assert (group.retry_backoff, group.retry_backoff_max) == (
        timedelta(seconds=1),
        timedelta(seconds=30),
    )
    assert dict(group.resources) == {}
    assert config.shutdown_timeout_for("default") == timedelta(seconds=30)
    assert config.metrics.listen == ListenAddress("127.0.0.1", 9464)
    assert config.metrics.stats_ttl == timedelta(seconds=10)
    assert config.metrics.task_name_label is False
    assert config.metrics.queue_stats == "all"
    assert config.metrics.duration_buckets[0] == 0.005
    assert config.retention.interval == timedelta(minutes=10)
    assert (config.retention.batch, config.retention.max_batches) == (500, 100)
    assert [r.describe() for r in config.retention.rules] == [
        "status=succeeded, older than 7d",
        "status=canceled, older than 7d",
        "status=failed, older than 30d",
    ]
    assert config.reaper.interval == timedelta(seconds=15)
    assert config.reload.max_surge == 1
    assert (config.logging.level, config.logging.format) == ("INFO", "text")
    assert config.logging.file is None and dict(config.logging.loggers) == {}
    assert config.runtime_dir == "/run/user/1000/cairnqd"
    assert config.warnings == ()


def test_backend_dependent_defaults_on_postgres(load: Loader) -> None:
    config = load(BASE.replace("path: ./t.db", "dsn: postgresql://localhost/q"))
    assert config.database.backend == "postgres"
    assert config.database.auto_migrate is False
    assert config.retention.batch == 1000


def test_runtime_dir_falls_back_to_the_temp_dir(load: Loader) -> None:
    config = load(BASE, env={"TMPDIR": "/var/tmp/x"})
    assert config.runtime_dir == f"/var/tmp/x/cairnqd-{os.geteuid()}"


def test_runtime_dir_prefers_systemd(load: Loader) -> None:
    config = load(BASE, env={"RUNTIME_DIRECTORY": "/run/cairnq:/run/other"})
    assert config.runtime_dir == "/run/cairnq"


def test_empty_sections_take_defaults(load: Loader) -> None:
    config = load(BASE + "metrics:\nlogging: {}\n")
    assert config.metrics.listen == ListenAddress("127.0.0.1", 9464)


def test_explicit_values(load: Loader) -> None:
    config = load(
        BASE
        + """\
    processes: 3
    concurrency: 16
    lease: 1m30s
    max_run: 15m
    max_tasks_per_child: 10000
    max_memory: 512MiB
    shutdown_timeout: 2m
    poll_interval: 250ms
    resources: {gpu: 1}
metrics: {listen: "[::1]:0", task_name_label: true, queue_stats: leader}
logging: {level: Debug, format: json, file: ./log.txt, loggers: {psycopg: warning}}
"""
    )
    group = config.groups["default"]
    assert group.processes == 3 and group.concurrency == 16
    assert group.lease == timedelta(seconds=90)
    assert group.max_memory == 512 * 2**20
    assert group.poll_interval == timedelta(milliseconds=250)
    assert dict(group.resources) == {"gpu": 1}
    assert config.shutdown_timeout_for("default") == timedelta(minutes=2)
    assert config.metrics.listen == ListenAddress("::1", 0)
    assert str(config.metrics.listen) == "[::1]:0"
    assert config.logging.level == "DEBUG"
    assert dict(config.logging.loggers) == {"psycopg": "WARNING"}
    # 15m > 2m: usable, but worth a warning.
    assert warnings_of(config) == [
        "cairnq.yaml:11:14: groups.default.max_run: 15m is longer than the shutdown_timeout "
        "of 2m: a task still running when a drain ends is cut off and runs again from the "
        "start (its attempt is given back up to 3 times, then spent)"
    ]


def test_logging_file_must_have_a_directory_to_go_in(
    errors: Errors, write: Callable[[str], Path], tmp_path: Path
) -> None:
    """The daemon does not create it (and would refuse to start): `check` refuses it."""
    assert errors(BASE + "logging:\n  file: missing/cairnqd.log\n") == [
        f"cairnq.yaml:9:9: logging.file: directory {tmp_path / 'missing'} does not exist; "
        "create it first"
    ]
    assert errors(BASE + f"logging:\n  file: {tmp_path}\n") == [
        f"cairnq.yaml:9:9: logging.file: {tmp_path} is a directory"
    ]
    (tmp_path / "logs").mkdir()
    config = load_config(write(BASE + "logging:\n  file: logs/cairnqd.log\n"), env={})
    assert config.logging.file == str(tmp_path / "logs" / "cairnqd.log")


@pytest.mark.parametrize(
    ("metrics", "dashboard"),
    [("127.0.0.1:9464", "127.0.0.1:9464"), ("0.0.0.0:9464", "127.0.0.1:9464"),
     ("[::]:9464", "127.0.0.1:9464")],
)  # fmt: skip
def test_metrics_and_dashboard_cannot_share_a_port(
    errors: Errors, metrics: str, dashboard: str
) -> None:
    text = BASE + f'metrics: {{listen: "{metrics}"}}\ndashboard: {{listen: "{dashboard}"}}\n'
    (problem,) = errors(text)
    assert problem.startswith("cairnq.yaml:9:") and "dashboard.listen: " in problem
    assert problem.endswith("takes metrics.listen's port (" + metrics + ")")


def test_metrics_and_dashboard_on_one_port_of_different_hosts_are_fine(
    write: Callable[[str], Path],
) -> None:
    text = BASE + 'metrics: {listen: "127.0.0.1:9464"}\ndashboard: {listen: "127.0.0.2:9464"}\n'
    load_config(write(text), env={})


# --- every error kind, with its position -------------------------------------------


def test_unknown_keys_with_did_you_mean(errors: Errors) -> None:
    assert errors(
        BASE
        + """\
    leese: 5s
    colour: red
metrix: {}
"""
    ) == [
        "cairnq.yaml:8:5: groups.default.leese: unknown key 'leese'; did you mean 'lease'?",
        "cairnq.yaml:9:5: groups.default.colour: unknown key 'colour' (expected one of: "
        "queues, handlers, processes, concurrency, prefetch, lease, stall_timeout, max_run, "
        "cancel_grace, max_tasks_per_child, max_memory, shutdown_timeout, poll_interval, "
        "retry_backoff, retry_backoff_max, resources)",
        "cairnq.yaml:10:1: metrix: unknown key 'metrix'; did you mean 'metrics'?",
    ]


def test_wrong_types(errors: Errors) -> None:
    assert errors(
        BASE
        + """\
    processes: true
    concurrency: two
    max_tasks_per_child: 1.5
    lease: [30s]
metrics: {task_name_label: yes, listen: 9464}
retention: {rules: {older_than: 7d}}
logging: {file: 42}
"""
    ) == [
        "cairnq.yaml:8:16: groups.default.processes: expected an integer ≥ 1, got true",
        "cairnq.yaml:9:18: groups.default.concurrency: expected an integer ≥ 1, got 'two'",
        "cairnq.yaml:10:26: groups.default.max_tasks_per_child: expected an integer ≥ 1, got 1.5",
        "cairnq.yaml:11:12: groups.default.lease: expected a duration like 30s, 5m, 1h, got a list",
        "cairnq.yaml:12:28: metrics.task_name_label: expected true or false, got 'yes' "
        "(YAML 1.2 reads yes/no/on/off as strings)",
        "cairnq.yaml:12:41: metrics.listen: expected host:port (e.g. 127.0.0.1:9464) or off, "
        "got 9464",
        "cairnq.yaml:13:20: retention.rules: expected a list, got a mapping",
        'cairnq.yaml:14:17: logging.file: expected a file path, got 42 (quote it: "42")',
    ]


def test_bad_durations(errors: Errors) -> None:
    assert errors(
        BASE
        + """\
    lease: soon
    max_run: 30
    shutdown_timeout: 1:30
    poll_interval: 1ms
    retry_backoff: 5m5m
"""
    ) == [
        "cairnq.yaml:8:12: groups.default.lease: expected a duration like 30s, 5m, 1h, got 'soon'",
        "cairnq.yaml:9:14: groups.default.max_run: expected a duration like 30s, 5m, 1h, "
        "got 30: add a unit, e.g. 30s",
        "cairnq.yaml:10:23: groups.default.shutdown_timeout: expected a duration like 30s, "
        "5m, 1h, got '1:30' (YAML 1.1 reads 1:30 as 90 seconds; write 1m30s)",
        "cairnq.yaml:11:20: groups.default.poll_interval: must be at least 10ms, got 1ms",
        "cairnq.yaml:12:20: groups.default.retry_backoff: expected a duration like 30s, 5m, "
        "1h, got '5m5m'",
    ]


def test_bad_sizes_ranges_and_enums(errors: Errors) -> None:
    assert errors(
        BASE
        + """\
    max_memory: 512
    processes: 0
    resources: {gpu: 0, "bad name": 1}
  second:
    queues: [q]
    max_memory: 1KiB
logging: {level: verbose, format: jsn}
"""
    ) == [
        "cairnq.yaml:8:17: groups.default.max_memory: expected a size like 512MiB, 1GiB, "
        "500MB, got 512: add a unit, e.g. 512MiB",
        "cairnq.yaml:9:16: groups.default.processes: expected an integer ≥ 1, got 0",
        "cairnq.yaml:10:22: groups.default.resources.gpu: expected an integer ≥ 1, got 0",
        "cairnq.yaml:10:25: groups.default.resources.bad name: expected a name like gpu or "
        "db_writer, got 'bad name'",
        "cairnq.yaml:13:17: groups.second.max_memory: must be at least 1MiB, got 1KiB",
        "cairnq.yaml:14:18: logging.level: expected one of debug, info, warning, error, "
        "critical, got 'verbose'",
        "cairnq.yaml:14:35: logging.format: expected one of text, json, got 'jsn'; did you "
        "mean 'json'?",
    ]


def test_strings_are_not_guessed(errors: Errors) -> None:
    assert errors(
        BASE.replace("queues: [default]", "queues: [default, 42, true, '']") + "database: {}\n"
    ) == [
        'cairnq.yaml:7:23: groups.default.queues[1]: expected a string, got 42 (quote it: "42")',
        "cairnq.yaml:7:27: groups.default.queues[2]: expected a string, got true "
        '(quote it: "true")',
        "cairnq.yaml:7:33: groups.default.queues[3]: must not be empty",
        "cairnq.yaml:8:1: database: duplicate key 'database' (first at line 2, column 1)",
    ]


def test_queue_named_no_is_a_string(load: Loader) -> None:
    config = load(BASE.replace("queues: [default]", "queues: [no, off, 0750]"))
    assert config.groups["default"].queues == ("no", "off", "0750")


def test_version_is_required_and_checked(errors: Errors) -> None:
    assert errors(BASE.replace("version: 1\n", "")) == [
        "cairnq.yaml:1:1: missing required key 'version'"
    ]
    assert errors(BASE.replace("version: 1", "version: 2")) == [
        "cairnq.yaml:1:10: version: expected 1, got 2 (this cairnqd reads config version 1)"
    ]


def test_top_level_must_be_a_mapping(errors: Errors) -> None:
    assert errors("- a\n- b\n") == ["cairnq.yaml:1:1: expected a mapping, got a list"]
    assert errors("") == [
        "cairnq.yaml:1:1: missing required key 'version'",
        "cairnq.yaml:1:1: database: set one of path (SQLite), dsn or dsn_file (Postgres)",
        "cairnq.yaml:1:1: missing required key 'groups'",
    ]


def test_groups(errors: Errors) -> None:
    assert errors(
        BASE
        + """\
  Mail:
    queues: []
  bulk: {processes: 2}
  dup:
    queues: [a, b, a]
"""
    ) == [
        "cairnq.yaml:8:3: groups.Mail: group name 'Mail' must match ^[a-z][a-z0-9_-]*$",
        "cairnq.yaml:9:13: groups.Mail.queues: must list at least one entry",
        "cairnq.yaml:10:9: groups.bulk: missing required key 'queues'",
        "cairnq.yaml:12:20: groups.dup.queues[2]: 'a' is listed twice",
    ]
    assert errors(BASE.replace("groups:\n  default:\n    queues: [default]\n", "groups: {}\n")) == [
        "cairnq.yaml:5:9: groups: define at least one group"
    ]


def test_stall_timeout_must_leave_room_inside_the_lease(load: Loader, errors: Errors) -> None:
    assert errors(BASE + "    lease: 30s\n    stall_timeout: 20s\n") == [
        "cairnq.yaml:9:20: groups.default.stall_timeout: must be at most half the lease (30s)"
    ]
    config = load(BASE + "    lease: 30s\n    stall_timeout: 15s\n")
    assert config.groups["default"].stall_bound.total_seconds() == 15.0


def test_stall_timeout_defaults_to_a_third_of_the_lease(load: Loader) -> None:
    config = load(BASE + "    lease: 3s\n")
    assert config.groups["default"].stall_bound.total_seconds() == 1.0


def test_retry_backoff_max_below_retry_backoff(errors: Errors) -> None:
    assert errors(BASE + "    retry_backoff: 10s\n    retry_backoff_max: 5s\n") == [
        "cairnq.yaml:9:24: groups.default.retry_backoff_max: must be at least retry_backoff (10s)"
    ]


def test_listen_addresses(load: Loader, errors: Errors) -> None:
    off = load(BASE + "metrics: {listen: off}\n")
    assert off.metrics.listen is None
    assert off.to_dict()["metrics"]["listen"] == "off"
    wide = load(BASE + "metrics: {listen: '0.0.0.0:9464'}\n")
    assert warnings_of(wide) == [
        "cairnq.yaml:8:19: metrics.listen: serves metrics beyond this host on 0.0.0.0:9464"
    ]
    assert load(BASE + "metrics: {listen: 'localhost:1'}\n").metrics.listen == ListenAddress(
        "localhost", 1
    )
    for bad in ("':9464'", "'::1:9464'", "'[nope]:1'", "'a b:1'", "'h:70000'"):
        [message] = errors(BASE + f"metrics: {{listen: {bad}}}\n")
        assert message.startswith("cairnq.yaml:8:19: metrics.listen: expected host:port"), bad


def test_many_problems_are_reported_at_once_sorted_by_position(errors: Errors) -> None:
    found = errors(
        """\
        version: 1
        logging: {level: loud}
        database:
          path: ./t.db
          busy_timeout: 5
        groups:
          mail:
            queues: [mail]
            lease: soon
            processes: 0
        handlers: [nope]
        """
    )
    assert found == [
        "cairnq.yaml:2:18: logging.level: expected one of debug, info, warning, error, "
        "critical, got 'loud'",
        "cairnq.yaml:5:17: database.busy_timeout: expected a duration like 30s, 5m, 1h, "
        "got 5: add a unit, e.g. 5s",
        "cairnq.yaml:9:12: groups.mail.lease: expected a duration like 30s, 5m, 1h, got 'soon'",
        "cairnq.yaml:10:16: groups.mail.processes: expected an integer ≥ 1, got 0",
        "cairnq.yaml:11:12: handlers[0]: expected module:attribute (e.g. "
        "myapp.tasks:registry), got 'nope'",
    ]


def test_syntax_error_comes_alone(errors: Errors) -> None:
    assert errors("version: 1\ngroups: [\nlease: soon\n") == [
        "cairnq.yaml:4:1: while parsing a flow sequence: expected ',' or ']', but got "
        "'<stream end>'"
    ]


def test_duplicate_and_tag_problems_join_the_schema_problems(errors: Errors) -> None:
    assert errors(BASE + "    lease: 1m\n    lease: 2m\n    max_run: !!binary eA==\n") == [
        "cairnq.yaml:9:5: groups.default.lease: duplicate key 'lease' (first at line 8, column 5)",
        "cairnq.yaml:10:14: groups.default.max_run: unsupported tag !!binary: only str, int, "
        "float, bool and null are allowed",
    ]


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.yaml", env={})
    assert str(info.value) == (
        f"{tmp_path / 'nope.yaml'}: cannot read the config file: No such file or directory"
    )


# --- interpolation -----------------------------------------------------------------


def test_env_interpolation_and_retyping(load: Loader, tmp_path: Path) -> None:
    config = load(
        BASE.replace("./t.db", "${DATA:-.}/t.db")
        + "    processes: ${PROCS:-2}\n    lease: ${LEASE}\n",
        env={"LEASE": "45s", "PROCS": "3"},
    )
    assert config.database.path == str(tmp_path / "t.db")
    assert config.groups["default"].processes == 3
    assert config.groups["default"].lease == timedelta(seconds=45)


def test_env_problems_name_the_variable_and_position(errors: Errors) -> None:
    assert errors(
        BASE + "    processes: ${PROCS}\n    lease: '${LEASE:?set LEASE}'\n",
        env={"PROCS": "many"},
    ) == [
        "cairnq.yaml:8:16: groups.default.processes: expected an integer ≥ 1, got 'many'",
        "cairnq.yaml:9:13: groups.default.lease: LEASE: set LEASE",
    ]
    # An unset variable is reported once, not again as a bad value.
    assert errors(BASE + "    max_memory: ${MEM}\n") == [
        "cairnq.yaml:8:17: groups.default.max_memory: environment variable MEM is not set "
        "(${MEM:-default} gives a fallback)"
    ]


# --- database and secrets ----------------------------------------------------------


def test_exactly_one_database_source(errors: Errors) -> None:
    assert errors(BASE.replace("  path: ./t.db\n", "  busy_timeout: 1s\n")) == [
        "cairnq.yaml:2:1: database: set one of path (SQLite), dsn or dsn_file (Postgres)"
    ]
    assert errors(BASE.replace("  path: ./t.db\n", "  path: ./t.db\n  dsn: host=h\n")) == [
        "cairnq.yaml:4:8: database.dsn: path and dsn are both set; keep one"
    ]


def test_dsn_file_with_credentials_directory(load: Loader, tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "cairnq-dsn").write_text("postgresql://app:s3cr$t@db/app\n")
    config = load(
        BASE.replace("path: ./t.db", "dsn_file: ${CREDENTIALS_DIRECTORY}/cairnq-dsn"),
        env={"CREDENTIALS_DIRECTORY": str(creds)},
    )
    assert config.database.dsn == "postgresql://app:s3cr$t@db/app"
    assert config.database.dsn_file == str(creds / "cairnq-dsn")
    assert "s3cr" not in repr(config)


def test_dsn_file_problems_are_reported_at_the_key(errors: Errors, tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "mysql").write_text("mysql://root:pw@h/db\n")
    text = BASE.replace("path: ./t.db", "dsn_file: {}")
    # Relative names are read from the config file's directory, and shown resolved.
    assert errors(text.format("./missing")) == [
        f"cairnq.yaml:3:13: database.dsn_file: cannot read {tmp_path}/missing: "
        "No such file or directory"
    ]
    assert errors(text.format("./empty")) == [
        f"cairnq.yaml:3:13: database.dsn_file: {tmp_path}/empty does not hold a DSN: is empty"
    ]
    assert errors(text.format("/dev/zero")) == [
        "cairnq.yaml:3:13: database.dsn_file: /dev/zero is longer than 65536 characters"
    ]
    # The message names the problem but never echoes the file's contents.
    assert errors(text.format("./mysql")) == [
        f"cairnq.yaml:3:13: database.dsn_file: {tmp_path}/mysql does not hold a DSN: unsupported "
        "scheme mysql://: expected postgresql://"
    ]


def test_dsn_syntax(errors: Errors) -> None:
    assert errors(BASE.replace("path: ./t.db", "dsn: just-a-host")) == [
        "cairnq.yaml:3:8: database.dsn: expected a postgresql:// URL or key=value pairs "
        "(host=... dbname=...)"
    ]


def test_sqlite_directory_must_exist(errors: Errors) -> None:
    assert errors(BASE.replace("./t.db", "./no/such/dir/t.db")) == [
        "cairnq.yaml:3:9: database.path: directory "
        f"{Path.cwd() / 'no' / 'such' / 'dir'} does not exist"
    ]


# --- handlers ----------------------------------------------------------------------


def test_group_handlers_replace_the_top_level_list(load: Loader) -> None:
    config = load(
        BASE
        + """\
  reports:
    queues: [reports]
    handlers: [myapp.reports:registry]
"""
    )
    assert config.groups["default"].handlers == ("cairnqd.demo:registry",)
    assert config.groups["reports"].handlers == ("myapp.reports:registry",)


def test_a_group_needs_handlers(errors: Errors) -> None:
    assert errors(BASE.replace("handlers: [cairnqd.demo:registry]\n", "")) == [
        "cairnq.yaml:5:3: groups.default: no handlers: list them at the top level or in this group"
    ]


def test_handler_paths_are_checked_not_imported(load: Loader, errors: Errors) -> None:
    # Syntax only: the parent never imports application code.
    load(BASE.replace("cairnqd.demo:registry", "not_installed.mod:reg.istry"))
    assert errors(BASE.replace("cairnqd.demo:registry", "a.b, c:d, 'e:f-g', h:i, h:i")) == [
        "cairnq.yaml:4:12: handlers[0]: expected module:attribute (e.g. myapp.tasks:registry), "
        "got 'a.b'",
        "cairnq.yaml:4:22: handlers[2]: expected module:attribute (e.g. myapp.tasks:registry), "
        "got 'e:f-g'",
        "cairnq.yaml:4:36: handlers[4]: 'h:i' is listed twice",
    ]


# --- retention ---------------------------------------------------------------------


def test_empty_rules_disable_purging_with_a_warning(load: Loader) -> None:
    config = load(BASE + "retention: {rules: []}\n")
    assert config.retention.rules == ()
    assert warnings_of(config) == [
        "cairnq.yaml:8:13: retention.rules: is empty: finished tasks are never purged"
    ]


def test_narrower_and_shorter_rules_are_fine(load: Loader) -> None:
    config = load(
        BASE
        + """\
retention:
  rules:
    - {status: succeeded, older_than: 7d}
    - {status: failed, older_than: 30d}
    - {queue: email, status: succeeded, older_than: 1d}
"""
    )
    assert len(config.retention.rules) == 3
    assert config.warnings == ()


def test_a_rule_inside_a_shorter_one_is_an_error_naming_both(errors: Errors) -> None:
    assert errors(
        BASE
        + """\
retention:
  rules:
    - {status: succeeded, older_than: 7d}
    - {status: succeeded, queue: email, older_than: 14d}
    - {status: succeeded, older_than: 7d}
"""
    ) == [
        "cairnq.yaml:11:7: retention.rules[1]: never deletes anything: retention.rules[0] "
        "(status=succeeded, older than 7d) removes those tasks first",
        "cairnq.yaml:12:7: retention.rules[2]: never deletes anything: retention.rules[0] "
        "(status=succeeded, older than 7d) removes those tasks first",
    ]


def test_rule_problems(errors: Errors) -> None:
    assert errors(BASE + "retention:\n  rules:\n    - {status: done}\n") == [
        "cairnq.yaml:10:7: retention.rules[0]: missing required key 'older_than'",
        "cairnq.yaml:10:16: retention.rules[0].status: expected one of succeeded, failed, "
        "canceled, got 'done'",
    ]


def test_partial_overlap_warns_at_the_longer_rule(load: Loader) -> None:
    config = load(
        BASE
        + """\
retention:
  rules:
    - {status: succeeded, older_than: 7d}
    - {name: report.build, older_than: 90d}
"""
    )
    assert warnings_of(config) == [
        "cairnq.yaml:11:7: retention.rules[1]: tasks also matched by retention.rules[0] "
        "(status=succeeded, older than 7d) are deleted after 7d"
    ]


# --- fingerprints, dumps, diffs ----------------------------------------------------

GROUPS = """\
version: 1
database: {path: ./t.db}
handlers: [cairnqd.demo:registry]
groups:
  mail:
    queues: [mail]
    lease: 1m
    processes: 2
  bulk:
    queues: [bulk]
"""


def test_fingerprint_ignores_key_order_and_processes(load: Loader) -> None:
    config = load(GROUPS)
    reordered = load(
        """\
        groups:
          bulk: {queues: [bulk]}
          mail: {processes: 2, lease: 60s, queues: [mail]}
        handlers: [cairnqd.demo:registry]
        database: {path: ./t.db}
        version: 1
        """
    )
    assert reordered.fingerprints() == config.fingerprints()
    assert len(config.group_fingerprint("mail")) == 64
    resized = load(GROUPS.replace("processes: 2", "processes: 5"))
    assert resized.fingerprints() == config.fingerprints()


def test_fingerprint_changes_with_what_a_child_starts_with(load: Loader) -> None:
    config = load(GROUPS)
    longer = load(GROUPS.replace("lease: 1m", "lease: 2m"))
    assert longer.group_fingerprint("mail") != config.group_fingerprint("mail")
    assert longer.group_fingerprint("bulk") == config.group_fingerprint("bulk")
    # Inherited handlers are part of the effective group config.
    handlers = load(GROUPS.replace("[cairnqd.demo:registry]", "[other.mod:reg]"))
    assert handlers.group_fingerprint("bulk") != config.group_fingerprint("bulk")
    # So are the database settings children use; parent-only settings are not.
    per_child = load(GROUPS.replace("{path: ./t.db}", "{path: ./t.db, busy_timeout: 1s}"))
    assert per_child.group_fingerprint("bulk") != config.group_fingerprint("bulk")
    parent_only = load(GROUPS + "logging: {level: debug}\nshutdown_timeout: 1m\n")
    assert parent_only.fingerprints() == config.fingerprints()


def test_cancel_grace_is_applied_in_place(load: Loader) -> None:
    """A changed cancel_grace reaches the children without a roll."""
    config = load(GROUPS)
    assert config.groups["mail"].cancel_grace == timedelta(seconds=10)
    shorter = load(GROUPS.replace("lease: 1m", "lease: 1m\n    cancel_grace: 500ms"))
    assert shorter.groups["mail"].cancel_grace == timedelta(milliseconds=500)
    assert shorter.fingerprints() == config.fingerprints()
    assert [str(change) for change in diff_configs(config, shorter)] == [
        "groups.mail.cancel_grace (parent-hot)"
    ]


def test_bad_cancel_grace(errors: Errors) -> None:
    assert errors(BASE + "    cancel_grace: 10\n") == [
        "cairnq.yaml:8:19: groups.default.cancel_grace: expected a duration like 30s, 5m, 1h, "
        "got 10: add a unit, e.g. 10s",
    ]
    assert errors(BASE + "    cancel_grace: null\n") == [
        "cairnq.yaml:8:19: groups.default.cancel_grace: expected a duration like 30s, 5m, 1h, "
        "got null",
    ]


def test_diff_classifies_changes(load: Loader) -> None:
    old = load(GROUPS)
    new = load(
        GROUPS.replace("lease: 1m", "lease: 2m")
        .replace("processes: 2", "processes: 3")
        .replace("path: ./t.db", "path: ./u.db")
        .replace("  bulk:\n    queues: [bulk]\n", "  fast:\n    queues: [fast]\n")
        + "logging: {loggers: {psycopg: warning}}\n"
    )
    assert [str(change) for change in diff_configs(old, new)] == [
        "groups.bulk (roll)",
        "groups.fast (roll)",
        "database.path (restart-only)",
        "groups.mail.processes (size-only)",
        "groups.mail.lease (roll)",
        "logging.loggers.psycopg (parent-hot)",
    ]
    assert diff_configs(old, load(GROUPS)) == []


def test_redaction() -> None:
    assert redact_dsn("postgresql://app:s3cret@db:5432/app") == "postgresql://app:***@db:5432/app"
    assert redact_dsn("postgresql://app@db/app") == "postgresql://app@db/app"
    assert redact_dsn("postgres://u:p@ss@h/db?sslmode=require") == (
        "postgres://u:***@h/db?sslmode=require"
    )
    assert redact_dsn("postgresql://h/db?user=u&password=pw&x=1") == (
        "postgresql://h/db?user=u&password=***&x=1"
    )
    assert redact_dsn("host=h password='a b\\'c' dbname=x") == "host=h password=*** dbname=x"
    assert redact_dsn("host=h PASSWORD = pw") == "host=h PASSWORD = ***"


def test_redacted_dump(load: Loader, tmp_path: Path) -> None:
    url = load(BASE.replace("path: ./t.db", "dsn: 'postgresql://u:hunter2@h/db'"))
    assert url.redacted()["database"]["dsn"] == "postgresql://u:***@h/db"
    (tmp_path / "dsn").write_text("host=h user=u\n")
    from_file = load(BASE.replace("path: ./t.db", "dsn_file: ./dsn"))
    database = from_file.redacted()["database"]
    assert (database["dsn"], database["dsn_file"]) == ("***", str(tmp_path / "dsn"))


@pytest.mark.parametrize(
    "database", ["path: ./t.db", "dsn: 'postgresql://u:pw@h/db'", "dsn_file: ./dsn"]
)
def test_unredacted_dump_loads_back_equal(load: Loader, tmp_path: Path, database: str) -> None:
    (tmp_path / "dsn").write_text("postgresql://u:pw@h/db\n")
    config = load(
        BASE.replace("path: ./t.db", database)
        + "    max_memory: 500MB\n    lease: 1h30m\n"
        + "  bulk: {queues: [bulk], handlers: [x.y:z], resources: {gpu: 2}}\n"
    )
    dumped = yaml.safe_dump(config.to_dict(redact=False), sort_keys=False)
    assert load(dumped) == config
    assert config.to_dict(redact=False)["groups"]["default"]["max_memory"] == "500MB"


# --- units -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ms"),
    [("250ms", 250), ("30s", 30_000), ("5m", 300_000), ("1h", 3_600_000), ("7d", 604_800_000),
     ("1h30m", 5_400_000), ("1m30s500ms", 90_500), ("0s", 0)],
)  # fmt: skip
def test_durations(text: str, ms: int) -> None:
    assert to_ms(parse_duration(text)) == ms
    assert format_duration(parse_duration(text)) == text


@pytest.mark.parametrize("text", ["", "30", "30 s", "5m5m", "30s5m", "1.5h", "-1s", "1w"])
def test_bad_duration_texts(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_sizes() -> None:
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("1GiB") == 2**30
    assert parse_size("500MB") == 500_000_000
    assert format_size(2**30) == "1GiB"
    assert format_size(500_000_000) == "500MB"
    assert format_size(1_024_000_000) == "1024MB"
    assert format_size(1000) == "1KB"
    assert format_size(1001) == "1001B"
    for bad in ("512", "1.5GiB", "512mb", "MiB"):
        with pytest.raises(ValueError):
            parse_size(bad)


# --- handler registries ------------------------------------------------------------


def test_task_registry_decorator_forms() -> None:
    registry = TaskRegistry()

    @registry.task
    async def plain(ctx: Any, payload: Any) -> None: ...

    @registry.task("mail.send")
    async def send(ctx: Any, payload: Any) -> None: ...

    @registry.task("embed", batch=64, resource="gpu")
    async def embed(ctxs: Any) -> None: ...

    @registry.task(batch=2)
    async def pairs(ctxs: Any) -> None: ...

    async def late(ctx: Any, payload: Any) -> None: ...

    registry.register("late", late, resource="db")
    handlers = registry.handlers
    assert list(handlers) == ["plain", "mail.send", "embed", "pairs", "late"]
    assert handlers["plain"] == (plain, None, None)
    assert handlers["embed"] == (embed, 64, "gpu")
    assert handlers["pairs"].batch == 2
    assert handlers["late"].resource == "db"
    with pytest.raises(ValueError, match="already registered"):
        registry.register("late", late)
    with pytest.raises(ValueError, match="batch"):
        registry.register("x", late, batch=0)
    with pytest.raises(ValueError, match="cannot derive a task name"):
        registry.task(lambda ctx: None)


def test_parse_handler_path() -> None:
    assert parse_handler_path("pkg.mod:obj.attr") == ("pkg.mod", "obj.attr")
    for bad in ("pkg.mod", "pkg..mod:x", ":x", "m:", "m:x:y", "1m:x", "m: x"):
        with pytest.raises(ValueError):
            parse_handler_path(bad)


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An importable module holding a registry, an SDK worker and some non-registries."""
    name = f"cairnqd_test_app_{id(tmp_path)}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """\
            from cairnqd.registry import TaskRegistry

            registry = TaskRegistry()

            @registry.task("app.one")
            async def one(ctx, payload):
                return 1

            clash = TaskRegistry()
            clash.register("app.one", one)

            class Holder:
                handlers = {"app.two": (one, 4, None)}

            holder = Holder()
            not_a_registry = 42
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_resolve_handlers_from_registries(app_module: str) -> None:
    resolved = resolve_handlers([f"{app_module}:registry", f"{app_module}:holder"])
    assert set(resolved) == {"app.one", "app.two"}
    assert resolved["app.one"].source == f"{app_module}:registry"
    assert (resolved["app.two"].batch, resolved["app.two"].resource) == (4, None)


def test_resolve_handlers_from_a_public_sdk_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    cairnq = pytest.importorskip("cairnq")

    class NoStore:  # the SDK only stores it at construction
        pass

    worker = cairnq.Worker(NoStore(), ["q"], resources={"gpu": 1})

    async def task(ctx: Any, payload: Any) -> None: ...

    worker.register("sdk.task", task, resource="gpu")

    monkeypatch.setattr(sys.modules[__name__], "sdk_worker", worker, raising=False)
    resolved = resolve_handlers([f"{__name__}:sdk_worker"])
    assert resolved["sdk.task"].fn is task
    assert resolved["sdk.task"].resource == "gpu"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz:registry", "cannot import no_such_module_xyz"),
        ("{app}:missing", "has no attribute missing"),
        ("{app}:not_a_registry", "is a int, not a handler registry"),
        ("bad spec", "expected module:attribute"),
    ],
)
def test_resolve_handlers_errors(app_module: str, spec: str, message: str) -> None:
    with pytest.raises(HandlerError, match=message):
        resolve_handlers([spec.format(app=app_module)])


def test_resolve_handlers_refuses_a_name_defined_twice(app_module: str) -> None:
    with pytest.raises(HandlerError, match=r"'app\.one' is also defined by"):
        resolve_handlers([f"{app_module}:registry", f"{app_module}:clash"])


def test_module_has_no_stray_public_names() -> None:
    for name in config_module.__all__:
        assert hasattr(config_module, name), name


# --- the demo handlers the example file points at ----------------------------------


class FakeContext:
    def __init__(self) -> None:
        self.progress_calls: list[tuple[float | None, str | None]] = []

    async def progress(self, value: float | None, message: str | None = None) -> None:
        self.progress_calls.append((value, message))


async def test_demo_handlers() -> None:
    from cairnqd import demo
    from cairnqd.errors import TaskError

    handlers = demo.registry.handlers
    ctx = FakeContext()
    assert await handlers["demo.echo"].fn(ctx, {"a": 1}) == {"a": 1}
    assert await handlers["demo.sleep"].fn(ctx, {"seconds": 0.02}) == {"slept": 0.02}
    assert ctx.progress_calls == [(1.0, "slept 0.0s of 0.02s")]
    with pytest.raises(TaskError, match="seconds"):
        await handlers["demo.sleep"].fn(ctx, {"seconds": "soon"})
    with pytest.raises(TaskError) as info:
        await handlers["demo.fail"].fn(ctx, {"retryable": True})
    assert info.value.retryable and info.value.code == "demo_failure"


def test_prefetch_is_auto_by_default_or_a_count(load: Loader, errors: Errors) -> None:
    assert load(BASE).groups["default"].prefetch == "auto"
    assert load(BASE + "    prefetch: 0\n").groups["default"].prefetch == 0
    assert load(BASE + "    prefetch: 64\n").groups["default"].prefetch == 64
    assert errors(BASE + "    prefetch: fast\n") == [
        "cairnq.yaml:8:15: groups.default.prefetch: expected auto or an integer ≥ 0, got 'fast'"
    ]
    assert errors(BASE + "    prefetch: -1\n") == [
        "cairnq.yaml:8:15: groups.default.prefetch: expected auto or an integer ≥ 0, got -1"
    ]
