"""A SQLite deployment's commands never load the Postgres driver (~0.2 s of imports)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import Run, cli_env, database_line, write_config


@pytest.mark.parametrize("command", ["stats", "list", "check"])
def test_sqlite_commands_do_not_import_psycopg(tmp_path: Path, run: Run, command: str) -> None:
    write_config(tmp_path, database_line("sqlite", str(tmp_path / "tasks.db")))
    assert run("migrate").returncode == 0
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cairnqd.cli", "-c", "cairnq.yaml", command],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    imported = [line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line]
    assert "cairnqd.store.sqlite" in imported  # the trace covers the store it opened
    assert not [m for m in imported if m.startswith(("psycopg", "psycopg_pool"))]


def test_sdk_import_leaves_postgres_for_first_use() -> None:
    code = (
        "import sys, cairnqd\n"
        "assert 'psycopg' not in sys.modules, 'imported eagerly'\n"
        "assert cairnqd.PostgresStore.__name__ == 'PostgresStore'\n"
        "assert 'psycopg' in sys.modules\n"
        "assert cairnqd.__version__\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_factory_default_call_timeout_matches_the_store() -> None:
    from cairnqd.store import factory
    from cairnqd.store.postgres import store as postgres

    assert factory.DEFAULT_CALL_TIMEOUT_S == postgres.DEFAULT_CALL_TIMEOUT_S
