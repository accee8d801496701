"""SQLite's insert_many is a row statement: its `values` row repeated per task, run in
statements of a power of two rows each (`sqlite_statements.run_rows`)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from cairnqd._protocol import rows_text, statement
from cairnqd.store.sqlite.statements import run_rows
from cairnqd.store.statement_params import insert_rows
from tests.protocol.sqldb import sqlite_ours

INSERT_MANY = statement("sqlite", "insert_many")


def _params(i: int) -> dict[str, object]:
    return {
        "id": f"task_{i:05d}",
        "name": "n",
        "queue": "q",
        "payload": f'{{"i": {i}}}',
        "metadata": "{}",
        "max_attempts": 3,
        "priority": i % 7,
        "parent_id": None,
        "root_id": f"task_{i:05d}",
        "correlation_id": None,
        "delay_ms": i,
    }


@pytest.mark.parametrize("variables", [999, 32766])
@pytest.mark.parametrize("count", [0, 1, 2, 3, 63, 64, 65, 255, 256, 257, 1000])
def test_every_row_lands_once_with_its_values(tmp_path: Path, count: int, variables: int) -> None:
    conn = sqlite_ours(tmp_path / "rows.db")
    # 999: what SQLite before 3.32 binds at most in one statement.
    conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, variables)
    run_rows(conn, INSERT_MANY, insert_rows([_params(i) for i in range(count)], 1_000))
    rows = conn.execute(
        "select id, queue, status, payload, priority, run_at_ms, created_at_ms, updated_at_ms"
        " from cairnq_tasks order by id"
    ).fetchall()
    assert [tuple(row) for row in rows] == [
        (f"task_{i:05d}", "q", "queued", f'{{"i": {i}}}', i % 7, 1_000 + i, 1_000, 1_000)
        for i in range(count)
    ]


@pytest.mark.parametrize("in_transaction", [False, True])
def test_a_failing_statement_leaves_none_of_the_rows(tmp_path: Path, in_transaction: bool) -> None:
    """300 rows run as 256 + 32 + 8 + 4: a clash in the last statement must take the
    first three's rows with it, in autocommit and inside a caller's transaction (whose
    own earlier writes stay)."""
    conn = sqlite_ours(tmp_path / "rows.db")
    conn.isolation_level = None
    run = [_params(i) for i in range(300)]
    run[-1] = {**run[-1], "id": run[0]["id"]}  # a primary-key clash in the last piece
    if in_transaction:
        conn.execute("begin immediate")
        run_rows(conn, INSERT_MANY, insert_rows([_params(999)], 1_000))
    with pytest.raises(sqlite3.IntegrityError):
        run_rows(conn, INSERT_MANY, insert_rows(run, 1_000))
    if in_transaction:
        conn.execute("commit")
    ids = [row[0] for row in conn.execute("select id from cairnq_tasks").fetchall()]
    assert ids == (["task_00999"] if in_transaction else [])
    assert not conn.in_transaction


def test_values_that_are_not_whole_rows_are_refused(tmp_path: Path) -> None:
    conn = sqlite_ours(tmp_path / "rows.db")
    values = insert_rows([_params(1)], 1_000)
    with pytest.raises(ValueError, match="not rows of 13"):
        run_rows(conn, INSERT_MANY, values[:-1])
    assert conn.execute("select count(*) from cairnq_tasks").fetchone()[0] == 0


def test_only_a_row_statement_repeats() -> None:
    assert INSERT_MANY.row_width == 13
    assert rows_text(INSERT_MANY, 2).count("?") == 26
    with pytest.raises(ValueError, match="not a row statement"):
        rows_text(statement("sqlite", "get"), 2)
