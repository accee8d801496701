"""Upper bounds: every value the daemon cannot use is refused at load, with its
file:line:col, its path and the allowed range, and so by `cairnqd check` (exit 78)
rather than by a child's boot, a claim, a submit or a purge once the daemon runs.

Also: a bad rule does not hide a problem between two other retention rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

import cairnqd
from cairnqd.config import SCHEMA, ConfigError, load_config, to_ms
from cairnqd.config.kinds import DurationKind, IntKind, MapKind, PrefetchKind, SizeKind
from cairnqd.config.schedule_kinds import MisfireKind
from cairnqd.daemon.boot import boot_for, decode_boot
from cairnqd.daemon.wire.messages import encode
from cairnqd.store.arguments import MAX_DURATION_MS, require_duration
from tests.support.configfiles import BASE, Errors, Loader, Write

#: One past the 64-bit integers the parent's pipe to its children carries.
PAST_INT64 = 2**63


def check(path: Path) -> subprocess.CompletedProcess[str]:
    """`python -m cairnqd.cli -c PATH check` with the cairnqd these tests import."""
    env = {k: v for k, v in os.environ.items() if k != "CAIRNQD_CONFIG"}
    env["PYTHONPATH"] = str(Path(cairnqd.__file__).resolve().parents[1])
    return subprocess.run(
        [sys.executable, "-m", "cairnqd.cli", "-c", str(path), "check"],
        cwd=path.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- defect 1: integers past 64 bits, and sizes ---------------------------------------


def test_group_numbers_a_child_cannot_boot_with_are_refused(errors: Errors, load: Loader) -> None:
    big = 99999999999999999999
    assert errors(
        BASE
        + f"""\
    concurrency: {big}
    prefetch: {big}
    max_tasks_per_child: {big}
    max_memory: 99999999999999999999999TiB
    resources: {{gpu: {big}}}
"""
    ) == [
        f"cairnq.yaml:8:18: groups.default.concurrency: expected an integer from 1 to 1024, "
        f"got {big}",
        f"cairnq.yaml:9:15: groups.default.prefetch: expected auto or an integer from 0 to "
        f"1024, got {big}",
        f"cairnq.yaml:10:26: groups.default.max_tasks_per_child: expected an integer from 1 "
        f"to 1000000000, got {big}",
        "cairnq.yaml:11:17: groups.default.max_memory: must be at most 1024TiB, got "
        "99999999999999999999999TiB",
        f"cairnq.yaml:12:22: groups.default.resources.gpu: expected an integer from 1 to "
        f"1024, got {big}",
    ]
    # Every value at its ceiling still goes through the parent's pipe to a child.
    config = load(
        """\
version: 1
database:
  path: ./t.db
  connections_per_child: 262143
  busy_timeout: 24d
handlers: [cairnqd.demo:registry]
groups:
  default:
    queues: [default]
    processes: 1024
    concurrency: 1024
    prefetch: 1024
    max_tasks_per_child: 1000000000
    max_memory: 1024TiB
    lease: 36500d
    max_run: 36500d
    resources: {gpu: 1024}
"""
    )
    group = config.groups["default"]
    boot = decode_boot(encode(boot_for(config, group, 0, 1, "w1")))
    assert boot.group_config.concurrency == 1024
    assert boot.nslots == 1024
    assert boot.max_memory == 1024 * 2**40
    assert boot.database.connections == 262143


def test_every_integer_and_size_setting_has_an_upper_bound(write: Write) -> None:
    """Each setting of the schema that holds a count or a size, set past 64 bits (or,
    for a size, past any machine), is refused at its own path."""
    cases: list[tuple[str, Any, str]] = []
    for setting in SCHEMA:
        kind = setting.kind
        if isinstance(kind, IntKind | PrefetchKind):
            cases.append((setting.path, PAST_INT64, ""))
        elif isinstance(kind, SizeKind):
            cases.append((setting.path, "99999999999999999999999TiB", ""))
        elif isinstance(kind, MapKind) and isinstance(kind.value, IntKind):
            cases.append((setting.path, {"x": PAST_INT64}, ".x"))
        elif isinstance(kind, MisfireKind):
            cases.append((setting.path, {"catch_up": PAST_INT64}, ".catch_up"))
    assert len(cases) >= 15  # the walk found them
    accepted = []
    for pattern, value, suffix in cases:
        document, where = _document_setting(pattern, value)
        path = write(yaml.safe_dump(document, sort_keys=False))
        try:
            load_config(path, env={})
        except ConfigError as exc:
            if any(p.path == where + suffix for p in exc.problems):
                continue
        accepted.append(pattern)
    assert accepted == []


def test_check_refuses_what_run_would_fail_on(write: Write) -> None:
    path = write(
        BASE
        + """\
    concurrency: 99999999999999999999
    processes: 100000000000
"""
    )
    proc = check(path)
    assert proc.returncode == 78, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{path}:8:18: groups.default.concurrency: expected an integer from 1 to 1024" in (
        proc.stderr
    )
    assert f"{path}:9:16: groups.default.processes: expected an integer from 1 to 1024, got " in (
        proc.stderr
    )


# --- defect 2: processes ----------------------------------------------------------------


def test_processes_is_bounded(errors: Errors, load: Loader) -> None:
    assert errors(BASE + "    processes: 100000000000\n") == [
        "cairnq.yaml:8:16: groups.default.processes: expected an integer from 1 to 1024, "
        "got 100000000000"
    ]
    # Below the minimum and of the wrong type, the words stay as they were.
    assert errors(BASE + "    processes: 0\n") == [
        "cairnq.yaml:8:16: groups.default.processes: expected an integer ≥ 1, got 0"
    ]
    assert load(BASE + "    processes: 1024\n").groups["default"].processes == 1024


# --- defect 3: durations ----------------------------------------------------------------


def test_durations_past_what_the_store_takes_are_refused(errors: Errors, load: Loader) -> None:
    assert errors(
        """\
version: 1
handlers: [cairnqd.demo:registry]
groups:
  default:
    queues: [default]
    lease: 36501d
    retry_backoff_max: 99999999999999999999d
schedules:
  s:
    name: demo.echo
    every: 1100000d
    jitter: 999999999d
retention:
  rules: [{older_than: 36501d}]
database:
  path: ./t.db
  busy_timeout: 25d
"""
    ) == [
        "cairnq.yaml:6:12: groups.default.lease: must be at most 36500d, got 36501d",
        "cairnq.yaml:7:24: groups.default.retry_backoff_max: must be at most 36500d, got "
        "99999999999999999999d",
        "cairnq.yaml:11:12: schedules.s.every: must be at most 36500d, got 1100000d",
        "cairnq.yaml:12:13: schedules.s.jitter: must be at most 36500d, got 999999999d",
        "cairnq.yaml:14:24: retention.rules[0].older_than: must be at most 36500d, got 36501d",
        "cairnq.yaml:17:17: database.busy_timeout: must be at most 24d, got 25d",
    ]
    # The longest lease accepted is one every claim takes.
    lease_ms = to_ms(load(BASE + "    lease: 36500d\n").groups["default"].lease)
    assert lease_ms == MAX_DURATION_MS
    assert require_duration(lease_ms, "lease_ms", minimum=1) == lease_ms


def test_every_duration_setting_has_an_upper_bound(write: Write) -> None:
    cases = [s.path for s in SCHEMA if isinstance(s.kind, DurationKind)]
    assert len(cases) >= 25
    accepted = []
    for pattern in cases:
        document, where = _document_setting(pattern, "36501d")
        path = write(yaml.safe_dump(document, sort_keys=False))
        try:
            load_config(path, env={})
        except ConfigError as exc:
            if any(p.path == where and "must be at most" in p.message for p in exc.problems):
                continue
        accepted.append(pattern)
    assert accepted == []


def test_check_refuses_a_huge_every_instead_of_crashing(write: Write) -> None:
    path = write(BASE + "schedules:\n  s:\n    name: demo.echo\n    every: 1100000d\n")
    proc = check(path)
    assert proc.returncode == 78, proc.stderr
    assert "Traceback" not in proc.stderr and "OverflowError" not in proc.stderr
    assert f"{path}:11:12: schedules.s.every: must be at most 36500d, got 1100000d" in proc.stderr


# --- defect 4: heartbeat_timeout against heartbeat_interval -----------------------------


def test_heartbeat_timeout_must_outlast_the_interval(errors: Errors, load: Loader) -> None:
    assert errors(BASE + "supervisor: {heartbeat_timeout: 1s, heartbeat_interval: 10s}\n") == [
        "cairnq.yaml:8:33: supervisor.heartbeat_timeout: must be longer than "
        "heartbeat_interval (10s)"
    ]
    assert errors(BASE + "supervisor:\n  heartbeat_interval: 5s\n  heartbeat_timeout: 5s\n") == [
        "cairnq.yaml:10:22: supervisor.heartbeat_timeout: must be longer than "
        "heartbeat_interval (5s)"
    ]
    config = load(BASE + "supervisor: {heartbeat_timeout: 10s, heartbeat_interval: 5s}\n")
    assert config.supervisor.heartbeat_timeout.total_seconds() == 10


# --- defect 5: queue names --------------------------------------------------------------


def test_queue_names_past_255_characters_are_refused(errors: Errors) -> None:
    long = "q" * 256
    assert errors(
        f"""\
version: 1
database: {{path: ./t.db}}
handlers: [cairnqd.demo:registry]
groups:
  default:
    queues: [default, {long}]
limits:
  l: {{queues: [{long}], concurrency: 1}}
schedules:
  s: {{name: demo.echo, every: 1h, queue: {long}}}
retention:
  rules: [{{queue: {long}, older_than: 1d}}]
"""
    ) == [
        "cairnq.yaml:6:23: groups.default.queues[1]: must be 1 to 255 characters, got 256",
        "cairnq.yaml:8:16: limits.l.queues[0]: must be 1 to 255 characters, got 256",
        "cairnq.yaml:10:42: schedules.s.queue: must be 1 to 255 characters, got 256",
        "cairnq.yaml:12:19: retention.rules[0].queue: must be 1 to 255 characters, got 256",
    ]


def test_a_queue_name_the_config_accepts_can_be_paused_and_submitted(
    load: Loader, errors: Errors
) -> None:
    from cairnqd.store.arguments import MAX_TEXT_BYTES
    from cairnqd.store.operator import check_queue_name

    name = "q" * 255
    (queue,) = load(BASE.replace("[default]", f"[{name}]")).groups["default"].queues
    assert check_queue_name(queue) == name
    assert len(queue.encode()) <= MAX_TEXT_BYTES
    # 255 characters of four bytes each: within the pause table, past a submit's 1000 bytes.
    wide = "\U0001f600" * 255
    assert errors(BASE.replace("[default]", f'["{wide}"]')) == [
        "cairnq.yaml:7:14: groups.default.queues[0]: must be at most 1000 bytes in UTF-8, got 1020"
    ]


def test_a_task_name_the_store_cannot_take_is_refused(errors: Errors) -> None:
    name = "n" * 1001
    assert errors(BASE + f"schedules:\n  s: {{name: {name}, every: 1h}}\n") == [
        "cairnq.yaml:9:13: schedules.s.name: must be at most 1000 bytes in UTF-8, got 1001"
    ]


# --- defect 6: a bad rule hid a dead one --------------------------------------------------


def test_a_bad_rule_does_not_hide_a_dead_one(errors: Errors) -> None:
    assert errors(
        BASE
        + """\
retention:
  rules:
    - {status: succeeded, older_than: 7d}
    - {status: succeeded, older_than: 1d}
    - {status: bogus, older_than: 1d}
"""
    ) == [
        "cairnq.yaml:10:7: retention.rules[0]: never deletes anything: retention.rules[1] "
        "(status=succeeded, older than 1d) removes those tasks first",
        "cairnq.yaml:12:16: retention.rules[2].status: expected one of succeeded, failed, "
        "canceled, got 'bogus'",
    ]


# --- found on the way: other values that crashed `check` or every run ---------------------


def test_bucket_bounds_past_any_duration_are_refused(errors: Errors) -> None:
    assert errors(
        BASE + f"metrics:\n  duration_buckets: [1, .inf]\n  wait_buckets: [1, {10**400}]\n"
    ) == [
        "cairnq.yaml:9:25: metrics.duration_buckets[1]: must be at most 3153600000, got inf",
        f"cairnq.yaml:10:21: metrics.wait_buckets[1]: must be at most 3153600000, got {10**400}",
    ]


def test_catch_up_is_bounded(errors: Errors) -> None:
    assert errors(
        BASE + "schedules:\n  s: {name: demo.echo, every: 1h, misfire: {catch_up: 100001}}\n"
    ) == [
        "cairnq.yaml:9:55: schedules.s.misfire.catch_up: expected an integer from 1 to "
        "100000, got 100001"
    ]


def test_text_that_is_not_unicode_is_refused_not_a_crash(write: Write) -> None:
    path = write(
        BASE.replace("[default]", '["de\\ud800f"]')
        + 'schedules:\n  s: {name: demo.echo, every: 1h, payload: {a: "x\\ud800"}}\n'
    )
    proc = check(path)
    assert proc.returncode == 78, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{path}:7:14: groups.default.queues[0]: contains a lone UTF-16 surrogate" in (
        proc.stderr
    )
    assert f"{path}:9:44: schedules.s.payload: not a JSON value" in proc.stderr


# --- the bounds agree with the runtime they stand for -------------------------------------


def test_the_bounds_are_the_runtimes() -> None:
    from cairnqd.config import bounds
    from cairnqd.daemon.starts import CAPACITY
    from cairnqd.store.arguments import MAX_DURATION_MS, MAX_TEXT_BYTES
    from cairnqd.store.operator import QUEUE_MAX

    assert to_ms(bounds.MAX_DURATION) == MAX_DURATION_MS
    assert bounds.QUEUE_NAME_MAX_CHARS == QUEUE_MAX
    assert bounds.STORED_TEXT_MAX_BYTES == MAX_TEXT_BYTES
    assert bounds.MAX_CONCURRENCY + bounds.MAX_PREFETCH <= CAPACITY
    assert to_ms(bounds.MAX_BUSY_TIMEOUT) < 2**31  # SQLite's busy_timeout is a C int


# --- helpers ------------------------------------------------------------------------------


def _document_setting(pattern: str, value: Any) -> tuple[dict[str, Any], str]:
    """A config that sets the setting `pattern` (`groups.*.lease`) to `value`, and the
    path its problems are reported at (`groups.default.lease`)."""
    document: dict[str, Any] = {
        "version": 1,
        "database": {"path": "./t.db"},
        "handlers": ["cairnqd.demo:registry"],
        "groups": {"default": {"queues": ["default"]}},
        "schedules": {"s": {"name": "demo.echo", "every": "1h"}},
        "limits": {"l": {"queues": ["default"], "concurrency": 1}},
        "retention": {"rules": [{"older_than": "1d"}]},
    }
    names = {"groups": "default", "schedules": "s", "limits": "l"}
    parts = pattern.replace("[]", ".0").split(".")
    where = [names[parts[0]] if p == "*" else p for p in parts]
    node: Any = document
    for part in where[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[where[-1]] = value
    return document, ".".join(where).replace(".0.", "[0].")
