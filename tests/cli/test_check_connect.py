"""`cairnqd check` says what it checked; `--connect` runs the daemon's pre-spawn checks."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

from tests.support.cli import GROUPS, Run, database_line, write_config


def test_plain_check_does_not_contact_the_database_and_says_so(tmp_path: Path, run: Run) -> None:
    write_config(tmp_path, 'dsn: "postgresql://nobody@127.0.0.1:1/none"')
    done = run("check")
    assert done.returncode == 0, done.stderr
    assert "database: postgres postgresql://nobody@127.0.0.1:1/none (not contacted)" in done.stdout
    assert done.stdout.splitlines()[-1] == (
        "checked: the config; the database was not contacted (--connect)"
    )
    assert "reachable" not in done.stdout and "handlers" not in done.stdout


def test_connect_on_a_migrated_database(db_config: Path, dialect: str, run: Run) -> None:
    done = run("check", "--connect")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith(f"./cairnq.yaml: OK (1 group, 2 queues, {dialect})")
    assert f"database: {dialect} " in out and " reachable\n" in out
    assert "migrations: none pending" in out
    assert "group default: handlers demo.echo, demo.fail, demo.sleep" in out
    assert out.splitlines()[-1] == "checked: the config, handler imports, the database"
    if dialect == "postgres":
        assert "connections: up to 5 of " in out  # 1 child x (1 + LISTEN) + 3 for the parent
    else:
        assert "connections:" not in out


def test_connect_refuses_an_unmigrated_postgres(tmp_path: Path, pg_dsn: str, run: Run) -> None:
    write_config(tmp_path, database_line("postgres", pg_dsn))
    done = run("check", "--connect")
    assert done.returncode == 78
    assert done.stdout.startswith("./cairnq.yaml: FAILED")
    problems = done.stderr.splitlines()
    # Every known migration is pending, however many there are.
    from cairnqd._protocol import migrations

    count = len(list(migrations("postgres")))
    assert problems[0].startswith(
        f"migrations: database has {count} pending migration(s) (0001_init"
    )
    assert problems[0].endswith("run `cairnqd -c ./cairnq.yaml migrate`")
    assert problems[1] == "cairnqd: ./cairnq.yaml: 1 problem; cairnqd would not start"


def test_connect_unreachable_exits_69(tmp_path: Path, run: Run) -> None:
    write_config(tmp_path, 'dsn: "postgresql://nobody@127.0.0.1:1/none"\n  connect_timeout: 1s')
    done = run("check", "--connect")
    assert done.returncode == 69, done.stderr
    assert "warning: database: postgres postgresql://nobody@127.0.0.1:1/none cannot be reached" in (
        done.stderr
    )
    assert done.stderr.splitlines()[-1] == "cairnqd: ./cairnq.yaml: the database cannot be reached"


def test_connect_on_a_missing_sqlite_file_leaves_it_missing(tmp_path: Path, run: Run) -> None:
    write_config(tmp_path, "path: tasks.db")
    done = run("check", "--connect")
    assert done.returncode == 0, done.stderr
    assert f"database: {tmp_path / 'tasks.db'} does not exist yet: created at start" in done.stdout
    assert not (tmp_path / "tasks.db").exists()
    write_config(tmp_path, "path: tasks.db\n  auto_migrate: false")
    done = run("check", "--connect")
    assert done.returncode == 78
    assert f"database: no database at {tmp_path / 'tasks.db'}; run `cairnqd" in done.stderr
    assert not (tmp_path / "tasks.db").exists()


def test_connect_checks_the_connection_budget(tmp_path: Path, pg_dsn: str, run: Run) -> None:
    write_config(tmp_path, database_line("postgres", pg_dsn) + "\n  expected_hosts: 100000")
    assert run("migrate").returncode == 0
    done = run("check", "--connect")
    assert done.returncode == 78
    assert "connections: the configuration opens up to" in done.stderr
    write_config(
        tmp_path,
        database_line("postgres", pg_dsn) + "\n  expected_hosts: 100000\n  connection_check: warn",
    )
    done = run("check", "--connect")
    assert done.returncode == 0, done.stderr
    assert "warning: connections: the configuration opens up to" in done.stderr


def test_connect_reports_handler_imports(
    tmp_path: Path, dialect: str, db_target: str, run: Run
) -> None:
    write_config(tmp_path, database_line(dialect, db_target))
    assert run("migrate").returncode == 0
    config = tmp_path / "cairnq.yaml"
    config.write_text(config.read_text().replace("cairnqd.demo:registry", "cairnqd.demo:nothing"))
    done = run("check", "--connect")
    assert done.returncode == 78
    assert "handlers: group default: " in done.stderr
    assert "cairnqd.demo has no attribute nothing" in done.stderr


def test_connect_refuses_a_port_another_program_holds(tmp_path: Path, run: Run) -> None:
    """`run` would stop at the bind (exit 78): so does the check, naming key and line."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        groups = GROUPS.replace("listen: off", f'listen: "127.0.0.1:{port}"')
        write_config(tmp_path, "path: tasks.db", groups=groups)
        done = run("check", "--connect")
        assert done.returncode == 78, done.stdout
        bind = f"metrics.listen: cannot bind 127.0.0.1:{port} (at ./cairnq.yaml:9:11)"
        assert bind in done.stderr
        assert "the address is already in use" in done.stderr
    done = run("check", "--connect")
    assert done.returncode == 0, done.stderr


def test_connect_writes_nothing_to_a_database_with_migrations_pending(
    tmp_path: Path, run: Run
) -> None:
    """The daemon would migrate it at start (auto_migrate); the check only says so."""
    database = tmp_path / "tasks.db"
    with sqlite3.connect(database) as conn:
        conn.execute("create table app_rows (x)")
    conn.close()
    write_config(tmp_path, "path: tasks.db")
    done = run("check", "--connect")
    assert done.returncode == 0, done.stderr
    assert "applied at start (auto_migrate)" in done.stdout
    assert "fleet: not read (migrations pending)" in done.stdout
    with sqlite3.connect(database) as conn:
        tables = conn.execute("select name from sqlite_master where type = 'table'").fetchall()
    conn.close()
    assert tables == [("app_rows",)]
