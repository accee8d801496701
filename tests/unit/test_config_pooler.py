"""`database.pooler`, `direct_dsn`/`direct_dsn_file` and `pool_size`: what they accept,
where they are refused, and that the direct DSN is redacted like the pooled one."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cairnqd.config import ConfigError, load_config
from cairnqd.daemon.boot import child_push
from cairnqd.daemon.parent.reload import restart_only_changes

PG = """\
version: 1
database:
  dsn: postgresql://app:s3cret@pgbouncer:6432/tasks
{extra}
handlers: [cairnqd.demo:registry]
groups:
  default:
    queues: [default]
"""


def write(tmp_path: Path, extra: str, base: str = PG) -> Path:
    path = tmp_path / "cairnq.yaml"
    path.write_text(base.format(extra=textwrap.indent(textwrap.dedent(extra), "  ")))
    return path


def problems(tmp_path: Path, extra: str, base: str = PG) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, extra, base), env={})
    return [str(p).replace(str(tmp_path) + "/", "") for p in info.value.problems]


def test_defaults_no_pooler(tmp_path: Path) -> None:
    db = load_config(write(tmp_path, ""), env={}).database
    assert db.pooler == "none"
    assert (db.direct_dsn, db.direct_dsn_file, db.pool_size) == (None, None, None)
    assert child_push(db) == "listen"


def test_transaction_pooler_with_direct_dsn_file(tmp_path: Path) -> None:
    secret = tmp_path / "direct"
    secret.write_text("postgresql://app:t0psecret@db-primary:5432/tasks\n")
    config = load_config(
        write(tmp_path, f"pooler: transaction\ndirect_dsn_file: {secret}\n"), env={}
    )
    db = config.database
    assert db.pooler == "transaction"
    assert db.direct_dsn == "postgresql://app:t0psecret@db-primary:5432/tasks"
    assert child_push(db) == "pipe"
    dumped = config.redacted()["database"]
    assert dumped["direct_dsn"] == "***"
    assert "t0psecret" not in repr(config)


def test_direct_dsn_is_redacted_and_decides_push(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, "pooler: session\ndirect_dsn: postgresql://app:pw@db:5432/tasks\n"),
        env={},
    )
    assert config.redacted()["database"]["direct_dsn"] == "postgresql://app:***@db:5432/tasks"
    without = load_config(write(tmp_path, "pooler: transaction\n"), env={})
    assert child_push(without.database) == "off"
    session = load_config(write(tmp_path, "pooler: session\n"), env={})
    assert child_push(session.database) == "listen"
    assert restart_only_changes(session, without) == ["database"]


def test_bad_pooler_settings_are_named(tmp_path: Path) -> None:
    assert problems(tmp_path, "pooler: pgbouncer\n") == [
        "cairnq.yaml:4:11: database.pooler: expected one of none, session, transaction, "
        "got 'pgbouncer'"
    ]
    found = problems(tmp_path, "direct_dsn: postgresql://a@b/c\ndirect_dsn_file: /nonexistent\n")
    assert found == [
        "cairnq.yaml:5:20: database.direct_dsn_file: direct_dsn and direct_dsn_file are both "
        "set; keep one"
    ]


def test_pooler_settings_apply_to_postgres_only(tmp_path: Path) -> None:
    sqlite = PG.replace("dsn: postgresql://app:s3cret@pgbouncer:6432/tasks", "path: ./t.db")
    found = problems(tmp_path, "pooler: session\npool_size: 20\n", sqlite)
    assert found == [
        "cairnq.yaml:4:11: database.pooler: applies to Postgres only (database.path is set)",
        "cairnq.yaml:5:14: database.pool_size: applies to Postgres only (database.path is set)",
    ]


def test_pool_size_without_session_pooler_warns(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "pool_size: 20\n"), env={})
    assert [w.message for w in config.warnings] == ["is only used with pooler: session"]
