"""The daemon checks the schema and every group's handlers once, before any child:
one `cannot start:` line per problem, exit 78, no "cairnqd started", no children."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.support.cli import GROUPS, Run, cli_env, database_line, write_config
from tests.support.waiting import wait_for


def start(config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cairnqd.cli", "-c", str(config)],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def refused(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The `cannot start:` lines, after checking the daemon refused to start."""
    assert done.returncode == 78, done.stderr
    assert "cairnqd started" not in done.stderr
    assert "spawned" not in done.stderr
    return [line for line in done.stderr.splitlines() if "cannot start:" in line]


def test_unmigrated_postgres_is_one_line_and_exit_78(tmp_path: Path, pg_dsn: str) -> None:
    config = write_config(tmp_path, database_line("postgres", pg_dsn))
    lines = refused(start(config, tmp_path))
    assert len(lines) == 1, lines
    assert "migrations: database has" in lines[0] and "pending migration(s)" in lines[0]
    assert f"run `cairnqd -c {config} migrate`" in lines[0]
    assert "CRITICAL" not in "\n".join(lines)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"dbname": "cairnqd_no_such_db"}, 'database "cairnqd_no_such_db" does not exist'),
        ({"user": "cairnqd_no_such_role"}, 'role "cairnqd_no_such_role" does not exist'),
    ],
)
def test_a_login_the_server_refuses_for_good_is_one_line_and_exit_78(
    tmp_path: Path, pg_dsn: str, change: dict[str, str], reason: str
) -> None:
    """No retry can fix a missing database or role: the daemon says so at once rather
    than waiting for the server as it does for one it cannot reach."""
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, **change)
    config = write_config(tmp_path, database_line("postgres", dsn))
    lines = refused(start(config, tmp_path))
    assert len(lines) == 1, lines
    assert f"refused the connection: {reason}; no retry can fix that" in lines[0]
    assert "correct database.dsn at " in lines[0] and "cairnq.yaml:" in lines[0]


def test_sqlite_without_auto_migrate_and_no_file(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, database_line("sqlite", str(tmp_path / "t.db")) + "\n  auto_migrate: false"
    )
    lines = refused(start(config, tmp_path))
    assert lines == [lines[0]] and f"no database at {tmp_path / 't.db'}" in lines[0]
    assert not (tmp_path / "t.db").exists()


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"], indirect=True)
def test_a_mistyped_handler_module_is_one_line_and_exit_78(
    tmp_path: Path, dialect: str, db_target: str, run: Run
) -> None:
    mistyped = GROUPS.replace(
        "handlers: [cairnqd.demo:registry]", "handlers: [cairnqd.dmeo:registry]"
    )
    config = write_config(tmp_path, database_line(dialect, db_target), groups=mistyped)
    assert run("migrate").returncode == 0
    lines = refused(start(config, tmp_path))
    assert len(lines) == 1, lines
    assert "handlers: group default: cairnqd.dmeo:registry: cannot import cairnqd.dmeo" in lines[0]
    assert "No module named 'cairnqd.dmeo'" in lines[0]


def test_a_broken_handler_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "badtasks.py").write_text("x = 1\nraise RuntimeError('no config for tasks')\n")
    groups = GROUPS.replace("cairnqd.demo:registry", "badtasks:registry")
    config = write_config(tmp_path, database_line("sqlite", str(tmp_path / "t.db")), groups=groups)
    lines = refused(start(config, tmp_path))
    assert len(lines) == 1
    assert f"{tmp_path / 'badtasks.py'}:2: badtasks:registry: cannot import badtasks" in lines[0]
    assert "no config for tasks" in lines[0]


def test_an_unreachable_database_is_a_warning_and_the_daemon_starts(tmp_path: Path) -> None:
    dsn = "postgresql://postgres@127.0.0.1:1/postgres"
    config = write_config(tmp_path, database_line("postgres", dsn) + "\n  connect_timeout: 1s")
    log = tmp_path / "daemon.log"
    with (
        log.open("w") as stderr,
        subprocess.Popen(
            [sys.executable, "-m", "cairnqd.cli", "-c", str(config)],
            cwd=tmp_path,
            env=cli_env(),
            stderr=stderr,
        ) as daemon,
    ):
        try:
            wait_for("cairnqd started", lambda: "cairnqd started" in log.read_text(), timeout=60)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
    text = log.read_text()
    assert "cannot start" not in text
    assert "WARNING cairnqd.supervisor database: postgres" in text and "cannot be reached" in text
