"""The schedules: section: every mistake reported with file:line:col, the values it
builds, and what a reload does with an added, changed or removed schedule."""

from __future__ import annotations

import textwrap
from datetime import timedelta
from pathlib import Path

import pytest

from cairnqd.config import ConfigError, Reload, diff_configs, load_config
from cairnqd.daemon.parent.reload import plan_reload
from cairnqd.schedules import CronSlots, EverySlots, Misfire
from tests.support.cli import run_cli

HEAD = """\
version: 1
database: {path: ./q.db}
handlers: [cairnqd.demo:registry]
groups:
  default: {queues: [default]}
"""


def write(tmp_path: Path, schedules: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(HEAD + "schedules:\n" + textwrap.indent(textwrap.dedent(schedules), "  "))
    return path


def problems(tmp_path: Path, schedules: str) -> list[str]:
    path = write(tmp_path, schedules)
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    return [str(p).replace(str(path), "c.yaml") for p in caught.value.problems]


def test_a_schedule_builds_its_values(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            """\
            nightly:
              name: demo.echo
              payload: {report: [1, 2]}
              cron: "@daily"
              timezone: Europe/Berlin
              jitter: 30s
              misfire: {catch_up: 7}
              priority: -3
            tick:
              name: demo.echo
              queue: default
              every: 90s
              enabled: false
            """,
        ),
        {},
    )
    nightly, tick = config.schedules["nightly"], config.schedules["tick"]
    assert nightly.schedule == "nightly" and nightly.name == "demo.echo"
    assert nightly.payload == {"report": [1, 2]} and nightly.priority == -3
    assert nightly.misfire == Misfire("catch_up", 7) and nightly.jitter == timedelta(seconds=30)
    assert isinstance(nightly.slots(), CronSlots) and nightly.rule == "cron @daily Europe/Berlin"
    assert tick.every == timedelta(seconds=90) and tick.misfire == Misfire("once")
    assert isinstance(tick.slots(), EverySlots) and tick.rule == "every 1m30s"
    assert not tick.enabled and tick.timezone is None and tick.max_attempts == 3
    # The dump reads back equal (config dump, fingerprints).
    assert config.to_dict(redact=False)["schedules"]["nightly"]["misfire"] == {"catch_up": 7}


def test_no_schedules_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(HEAD)
    assert load_config(path, {}).schedules == {}


def test_every_mistake_is_reported_with_file_line_col(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        """\
        feb30:
          name: demo.echo
          cron: "0 0 30 2 *"
        both:
          name: demo.echo
          cron: "@daily"
          every: 1h
        neither:
          name: demo.echo
        zone:
          name: demo.echo
          cron: "0 3 * * *"
          timezone: Mars/Base
        zone-every:
          name: demo.echo
          every: 5m
          timezone: UTC
        no-limit:
          name: demo.echo
          every: 5m
          misfire: catch_up
        zero-limit:
          name: demo.echo
          every: 5m
          misfire: {catch_up: 0}
        Bad_Name:
          name: demo.echo
          every: 5m
        fast:
          name: demo.echo
          every: 500ms
          payload: {x: .nan}
        nameless:
          every: 1m
          queu: x
        seconds:
          name: demo.echo
          cron: "* * * * * *"
        """,
    )
    assert found == [
        "c.yaml:9:11: schedules.feb30.cron: '0 0 30 2 *': never fires: no month it lists has "
        "that day",
        "c.yaml:13:12: schedules.both.every: cron and every are both set; keep one",
        "c.yaml:14:3: schedules.neither: set one of cron or every",
        "c.yaml:19:15: schedules.zone.timezone: unknown time zone 'Mars/Base' (expected an "
        "IANA name like Europe/Berlin)",
        "c.yaml:23:15: schedules.zone-every.timezone: applies to cron only: every: counts from "
        "the Unix epoch; use cron for a time of day in a zone",
        "c.yaml:27:14: schedules.no-limit.misfire: catch_up needs a limit: write misfire: "
        "{catch_up: 10}",
        "c.yaml:31:25: schedules.zero-limit.misfire.catch_up: expected an integer ≥ 1, got 0",
        "c.yaml:32:3: schedules.Bad_Name: schedule name 'Bad_Name' must match ^[a-z][a-z0-9_-]*$",
        "c.yaml:37:12: schedules.fast.every: must be at least 1s, got 500ms",
        "c.yaml:38:14: schedules.fast.payload: not a JSON value: NaN and infinities cannot be "
        "stored",
        "c.yaml:40:5: schedules.nameless: missing required key 'name'",
        "c.yaml:41:5: schedules.nameless.queu: unknown key 'queu'; did you mean 'queue'?",
        "c.yaml:44:11: schedules.seconds.cron: expected 5 fields (minute hour day-of-month "
        "month day-of-week) or a macro like @daily, got 6 fields; seconds are not supported, "
        "use every: for that",
    ]


def test_a_queue_no_group_claims_is_a_warning(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, "mail:\n  name: demo.echo\n  queue: email\n  every: 1m\n"), {}
    )
    (warning,) = config.warnings
    assert "schedules.mail.queue" in str(warning) and "'email'" in str(warning)


def test_reload_of_schedules_is_hot_and_rolls_nothing(tmp_path: Path) -> None:
    old = load_config(write(tmp_path, "a:\n  name: demo.echo\n  every: 1m\n", "old.yaml"), {})
    new = load_config(
        write(
            tmp_path,
            "a:\n  name: demo.echo\n  cron: '*/5 * * * *'\n"
            "b:\n  name: demo.echo\n  every: 1h\n  payload: {k: 1}\n",
            "new.yaml",
        ),
        {},
    )
    changes = {c.path: c.reload for c in diff_configs(old, new)}
    assert changes == {
        "schedules.b": Reload.HOT,
        "schedules.a.cron": Reload.HOT,
        "schedules.a.every": Reload.HOT,
    }
    plan = plan_reload(old, new, fatal=[], roll_all=False)
    assert plan.rolled == () and plan.new_generation
    assert set(plan.hot) == set(changes)
    removed = {c.path for c in diff_configs(new, old)}
    assert "schedules.b" in removed


def test_check_lists_schedules_and_warns_of_an_unregistered_task(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "known:\n  name: demo.echo\n  every: 1m\nunknown:\n  name: demo.nope\n  every: 1h\n",
    )
    proc = run_cli("check", "--handlers", "-c", str(path), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "schedule known: demo.echo on default, every 1m, next " in proc.stdout
    assert "schedule unknown: demo.nope on default, every 1h, next " in proc.stdout
    assert "registers 'demo.nope'" in proc.stderr and "demo.echo'" not in proc.stderr
