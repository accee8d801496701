"""`cairnqd purge`: bare, the configured rules as the daemon applies them; wider
deletes only with explicit filters and --yes (or a yes at a terminal prompt)."""

from __future__ import annotations

import json
import os
import pty
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from cairnqd import CairnQ
from tests.support.cli import Run, cli_env, database_line, write_config
from tests.support.harness import client_call

RULES = """\
retention:
  rules:
    - {queue: mail, older_than: 1h}
    - {older_than: 30d}
"""
HOUR_MS = 3_600_000


def age(dialect: str, target: str, task_id: str, ms: int) -> None:
    """Move a finished task's completion (and creation) `ms` into the past."""
    sql = (
        "update cairnq_tasks set completed_at_ms = completed_at_ms - {p}, "
        "created_at_ms = created_at_ms - {p} where id = {q}"
    )
    if dialect == "sqlite":
        with sqlite3.connect(target) as conn:
            conn.execute(sql.format(p="?", q="?"), (ms, ms, task_id))
    else:
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(sql.format(p="%s", q="%s"), (ms, ms, task_id))  # type: ignore[arg-type]


@pytest.fixture
def tasks(tmp_path: Path, dialect: str, db_target: str, run: Run) -> dict[str, str]:
    """Four canceled tasks: mail 2h old, mail fresh, default 2h old, default 31d old."""
    write_config(tmp_path, database_line(dialect, db_target), RULES)
    assert run("migrate").returncode == 0
    ages = {
        "mail_old": ("mail", 2 * HOUR_MS),
        "mail_new": ("mail", 0),
        "default_2h": ("default", 2 * HOUR_MS),
        "default_31d": ("default", 31 * 24 * HOUR_MS),
    }

    # Made through the client, not the command line: what is under test is `purge`,
    # and eight more CLI processes per test were most of this file's time.
    async def make(client: CairnQ) -> dict[str, str]:
        made = {}
        for label, (queue, _) in ages.items():
            task = await client.submit("demo.echo", {}, queue=queue)
            canceled = await client.cancel(task.id)
            assert canceled is not None and canceled.status == "canceled"
            made[label] = task.id
        return made

    made: dict[str, str] = client_call(dialect, db_target, make)
    for label, (_, ms) in ages.items():
        age(dialect, db_target, made[label], ms)
    return made


def remaining(run: Run) -> set[str]:
    return {t["id"] for t in json.loads(run("list", "--json").stdout)}


def test_bare_purge_applies_the_configured_rules(tasks: dict[str, str], run: Run) -> None:
    dry = run("purge", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        "rule 1: queue=mail, older than 1h: would delete 1",
        "rule 2: all finished tasks, older than 30d: would delete 1",
        "would delete up to 2 task(s) by retention.rules (a task two rules match is counted twice)",
    ]
    assert len(remaining(run)) == 4
    done = run("purge")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "rule 1: queue=mail, older than 1h: deleted 1",
        "rule 2: all finished tasks, older than 30d: deleted 1",
        "deleted 2 task(s) by retention.rules",
    ]
    assert remaining(run) == {tasks["mail_new"], tasks["default_2h"]}


def test_explicit_filters_need_yes(tasks: dict[str, str], run: Run) -> None:
    refused = run("purge", "--older-than", "1h")
    assert refused.returncode == 64
    assert "would delete 3 task(s): all finished tasks, older than 1h" in refused.stderr
    assert "add --yes" in refused.stderr
    assert len(remaining(run)) == 4
    done = run("purge", "--older-than", "1h", "--queue", "default", "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "deleted 2 task(s): queue=default, older than 1h\n"
    assert remaining(run) == {tasks["mail_old"], tasks["mail_new"]}


def test_no_rules_purges_nothing(tmp_path: Path, run: Run) -> None:
    write_config(
        tmp_path, database_line("sqlite", str(tmp_path / "t.db")), "retention:\n  rules: []\n"
    )
    assert run("migrate").returncode == 0
    done = run("purge")
    assert done.returncode == 0
    assert done.stdout.startswith("retention.rules is empty: the configured rules delete nothing")


def _on_a_terminal(tmp_path: Path, answer: str, *args: str) -> tuple[int, str]:
    """Run purge with stdin, stdout and stderr on a pseudo-terminal; type `answer`."""
    controller, terminal = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "cairnqd.cli", "purge", *args],
        cwd=tmp_path,
        env=cli_env(),
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    ) as proc:
        os.close(terminal)
        seen = b""
        while b"[y/N]" not in seen:
            chunk = os.read(controller, 1024)
            assert chunk, seen
            seen += chunk
        os.write(controller, answer.encode() + b"\n")
        try:
            while chunk := os.read(controller, 1024):
                seen += chunk
        except OSError:  # EIO: the child closed the terminal
            pass
        code = proc.wait(timeout=60)
    os.close(controller)
    return code, seen.decode(errors="replace")


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
def test_a_terminal_is_asked(tasks: dict[str, str], tmp_path: Path, run: Run) -> None:
    code, text = _on_a_terminal(tmp_path, "n", "--queue", "mail")
    assert code == 1, text
    assert "delete 2 task(s): queue=mail, older than 0s? [y/N]" in text
    assert "nothing deleted" in text
    assert len(remaining(run)) == 4
    code, text = _on_a_terminal(tmp_path, "y", "--queue", "mail")
    assert code == 0, text
    assert "deleted 2 task(s): queue=mail, older than 0s" in text
    assert remaining(run) == {tasks["default_2h"], tasks["default_31d"]}


def test_purge_waits_its_turn_behind_a_daemons_sweep(tmp_path: Path, pg_dsn: str, run: Run) -> None:
    write_config(tmp_path, database_line("postgres", pg_dsn), RULES)
    assert run("migrate").returncode == 0
    with psycopg.connect(pg_dsn, autocommit=True) as holder:
        # What the daemon's sweep holds: (database.lock_namespace, 1).
        holder.execute("select pg_advisory_lock(1668378212, 1)")
        busy = run("purge")
        assert busy.returncode == 75, busy.stderr
        assert "another host is purging this database right now" in busy.stderr
    assert run("purge").returncode == 0
