"""`cairnqd list`, `inspect`, `stats` and the control commands on rows another client
wrote (a public SDK, hand-written SQL) that SQLite's loose typing lets through: text in
an integer or real column, a JSON number no float holds (`1e999`), a status the protocol
lacks. Each command shows the value as it is, marked "(unreadable)", names the task and
exits 0; JSON output stays valid JSON. Also: times to the exact millisecond, and the
exit code 1 of a pause or a cancel that changes nothing (docs/operations.md, section 7).

Each odd row is a copy of a row `cairnqd submit` wrote, with one column changed by plain
SQL, as another client would."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import Run, database_line, write_config

pytestmark = pytest.mark.timeout(180)


def _strict_json(text: str) -> Any:
    """JSON as a strict parser reads it: a bare NaN or Infinity is an error."""

    def refuse(token: str) -> Any:
        raise AssertionError(f"not JSON: bare {token}")

    return json.loads(text, parse_constant=refuse)


def _database(config: Path) -> Path:
    return config.parent / "tasks.db"


def _submit(run: Run, *args: str) -> str:
    done = run("submit", "demo.echo", "--payload", '{"x": 1}', *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _copy(
    config: Path, source: str, new_id: str, *, unchecked: bool = False, **changes: Any
) -> None:
    """Insert a copy of task `source` as `new_id`, `changes` applied (with the table's
    CHECK constraints off when `unchecked`, as `pragma ignore_check_constraints` does)."""
    with closing(sqlite3.connect(_database(config))) as conn:
        conn.row_factory = sqlite3.Row
        row = dict(conn.execute("select * from cairnq_tasks where id = ?", (source,)).fetchone())
        row.update(id=new_id, root_id=new_id, **changes)
        if unchecked:
            conn.execute("pragma ignore_check_constraints = 1")
        columns = list(row)
        conn.execute(
            f"insert into cairnq_tasks ({', '.join(columns)}) "
            f"values ({', '.join('?' * len(columns))})",
            [row[c] for c in columns],
        )
        conn.commit()


def _query(config: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(_database(config))) as conn:
        return conn.execute(sql, params).fetchall()


def _ok(result: Any) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return str(result.stdout)


def test_text_in_integer_columns_is_shown_marked(sqlite_db: Path, run: Run) -> None:
    good = _submit(run)
    (done_at,) = _query(sqlite_db, "select updated_at_ms from cairnq_tasks")[0]
    _copy(sqlite_db, good, "task_soon", run_at_ms="soon")
    _copy(sqlite_db, good, "task_yesterday", created_at_ms="yesterday")
    _copy(sqlite_db, good, "task_words", attempt="one", max_attempts="three")
    _copy(sqlite_db, good, "task_half_words", attempt="one")
    finished = {"completed_at_ms": done_at, "status": "succeeded", "result": "1"}
    _copy(sqlite_db, good, "task_done_soon", run_at_ms="soon", **finished)
    _copy(sqlite_db, good, "task_failed_one", status="failed", attempt="one", error='{"m":1}')
    _copy(sqlite_db, good, "task_high", priority="high")

    for filters in ([], ["--queue", "default"], ["--name", "demo.echo"]):
        listed = run("list", *filters)
        out = _ok(listed)
        assert "soon (unreadable)" in out and "yesterday (unreadable)" in out
        assert "one (unreadable)/three (unreadable)" in out and "one (unreadable)/3" in out
        assert "high (unreadable)" in out
        # The task is named, with the column and what it holds.
        assert "task task_soon: run_at_ms holds 'soon': not an integer" in listed.stderr
        assert "task task_words: attempt holds 'one'" in listed.stderr
    assert "task_done_soon" in _ok(run("list", "--status", "succeeded"))
    failed = _ok(run("list", "--status", "failed"))
    assert "task_failed_one" in failed and "one (unreadable)/3" in failed

    rows = {r["id"]: r for r in _strict_json(_ok(run("list", "--json")))}
    assert rows["task_soon"]["run_at_ms"] == {"undecodable": "not an integer", "raw": "soon"}
    assert rows["task_words"]["attempt"] == {"undecodable": "not an integer", "raw": "one"}
    assert rows[good]["run_at_ms"] == done_at  # a good row as always

    inspected = _ok(run("inspect", "task_soon"))
    assert "run_at_ms: soon (unreadable)" in inspected
    assert "id: task_soon" in inspected
    assert "created_at_ms: yesterday (unreadable)" in _ok(run("inspect", "task_yesterday"))
    words = _ok(run("inspect", "task_words"))
    assert "attempt: one (unreadable)/three (unreadable)" in words
    assert "max_attempts: three (unreadable)" in words
    assert "attempt: one (unreadable)/3" in _ok(run("inspect", "task_half_words"))
    as_json = _strict_json(_ok(run("inspect", "--json", "task_done_soon")))
    assert as_json["run_at_ms"] == {"undecodable": "not an integer", "raw": "soon"}
    assert as_json["completed_at_ms"] == done_at


def test_json_output_stays_json_whatever_a_number_holds(sqlite_db: Path, run: Run) -> None:
    good = _submit(run)
    (done_at,) = _query(sqlite_db, "select updated_at_ms from cairnq_tasks")[0]
    finished = {"completed_at_ms": done_at, "status": "succeeded"}
    # json_valid accepts 1e999; Python reads it as infinite.
    _copy(sqlite_db, good, "task_inf", result="1e999", **finished)
    _copy(sqlite_db, good, "task_deep_inf", result='{"a": [-1e999, "Infinity NaN"]}', **finished)
    # A real column holding text, and one holding an infinite real.
    _copy(sqlite_db, good, "task_half", progress="half")
    _copy(sqlite_db, good, "task_endless", progress=float("inf"))
    envelope = '{"code": "x", "message": "m", "retryable": false, "details": {"n": 1e999}}'
    _copy(
        sqlite_db, good, "task_error_inf", error=envelope, status="failed", completed_at_ms=done_at
    )

    rows = {r["id"]: r for r in _strict_json(_ok(run("list", "--json")))}
    too_large = {"undecodable": "a number too large for a 64-bit float", "raw": "Infinity"}
    assert rows["task_inf"]["result"] == too_large
    assert rows["task_deep_inf"]["result"] == {
        "a": [{**too_large, "raw": "-Infinity"}, "Infinity NaN"]  # a string stays a string
    }
    assert rows["task_half"]["progress"] == {"undecodable": "not a number", "raw": "half"}
    assert rows["task_endless"]["progress"] == {"undecodable": "not a finite number", "raw": "inf"}

    assert _strict_json(_ok(run("inspect", "--json", "task_inf")))["result"] == too_large
    shown = _ok(run("inspect", "task_inf"))
    assert "result: Infinity" not in shown
    assert '"raw": "Infinity"' in shown
    assert 'details: {"n": {"undecodable": "a number too large' in _ok(
        run("inspect", "task_error_inf")
    )
    assert "progress: half (unreadable)" in _ok(run("inspect", "task_half"))
    assert "progress: inf (unreadable)" in _ok(run("inspect", "task_endless"))
    listed = run("list")
    _ok(listed)
    assert "task task_inf: result holds a number JSON cannot carry" in listed.stderr


def test_stats_counts_statuses_the_protocol_lacks(sqlite_db: Path, run: Run) -> None:
    good = _submit(run)
    _copy(sqlite_db, good, "task_paused", unchecked=True, status="paused")
    _copy(sqlite_db, good, "task_upper", unchecked=True, status="QUEUED")

    lines = _ok(run("stats")).splitlines()
    assert lines[0].split() == [
        "QUEUE", "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELED", "OTHER", "TOTAL"
    ]  # fmt: skip
    assert lines[1].split() == ["default", "1", "0", "0", "0", "0", "2", "3"]  # adds up
    assert any(
        line.startswith("OTHER counts 2 task(s) whose status is none of the protocol's")
        and "'QUEUED': 1" in line
        and "'paused': 1" in line
        for line in lines
    )
    stats = run("stats", "--json")
    counts = _strict_json(_ok(stats))["default"]
    assert counts["queued"] == 1 and counts["other"] == 2
    assert counts["other_statuses"] == {"QUEUED": 1, "paused": 1}
    assert "OTHER counts 2 task(s)" in stats.stderr
    # `list` shows them, marked.
    assert "paused (unreadable)" in _ok(run("list"))


def test_times_are_exact_to_the_millisecond(sqlite_db: Path, run: Run) -> None:
    good = _submit(run)
    _copy(sqlite_db, good, "task_last", run_at_ms=253_402_300_799_999)
    _copy(sqlite_db, good, "task_beyond", run_at_ms=253_402_300_800_000)
    shown = _ok(run("inspect", "task_last"))
    assert "run_at_ms: 253402300799999 (9999-12-31T23:59:59.999Z)" in shown
    assert "9999-12-31T23:59:59Z" in _ok(run("list"))
    # Past any date: shown as the number it is, marked, not a traceback.
    assert "run_at_ms: 253402300800000 (unreadable)" in _ok(run("inspect", "task_beyond"))


def test_a_pause_that_changes_nothing_exits_1(sqlite_db: Path, run: Run) -> None:
    assert run("pause", "--queue", "mail").returncode == 0
    again = run("pause", "--queue", "mail")
    assert again.returncode == 1, again.stderr
    assert "already paused: mail" in again.stdout
    assert "nothing paused" in again.stderr
    both = run("pause", "--queue", "mail", "--queue", "default")  # one changed: done
    assert both.returncode == 0 and "paused default" in both.stdout


def test_a_second_cancel_of_a_running_task_exits_1(sqlite_db: Path, run: Run) -> None:
    good = _submit(run)
    _copy(
        sqlite_db, good, "task_running", status="running", worker_id="w1",
        lease_until_ms=253_402_300_799_999,
    )  # fmt: skip
    first = run("cancel", "task_running")
    assert first.returncode == 0 and "cancel requested" in first.stdout
    (requested,) = _query(
        sqlite_db, "select cancel_requested_at_ms from cairnq_tasks where id = 'task_running'"
    )[0]
    second = run("cancel", "task_running")
    assert second.returncode == 1
    assert "its cancel was already requested" in second.stderr
    assert _query(
        sqlite_db, "select cancel_requested_at_ms from cairnq_tasks where id = 'task_running'"
    ) == [(requested,)]


def test_submit_wait_names_the_limit_holding_the_task_back(
    sqlite_db: Path, tmp_path: Path, run: Run
) -> None:
    write_config(
        tmp_path,
        database_line("sqlite", str(_database(sqlite_db))),
        extra="limits:\n  smtp:\n    queues: [mail]\n    concurrency: 1\n",
    )
    good = _submit(run, "--queue", "mail")
    _copy(
        sqlite_db, good, "task_running", status="running", worker_id="w1",
        lease_until_ms=253_402_300_799_999,
    )  # fmt: skip
    run("cancel", good)
    waited = run("submit", "demo.echo", "--queue", "mail", "--wait", "--timeout", "1s", timeout=60)
    assert waited.returncode == 75, waited.stderr
    assert "waiting for room in limit smtp: 1/1 running" in waited.stderr
    assert "never claimed" not in waited.stderr
