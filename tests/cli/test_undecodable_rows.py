"""`cairnqd list`, `inspect` and `stats` on a row another client wrote that this
runtime cannot decode: they show it, its text escaped, and exit 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import Run
from tests.support.undecodable import bad_row_for_reads, insert_bad

pytestmark = pytest.mark.timeout(180)


def test_reads_show_an_undecodable_row_and_exit_0(
    db_config: Path, dialect: str, db_target: str, run: Run
) -> None:
    assert run("submit", "demo.echo", "--payload", '{"x": 1}').returncode == 0
    insert_bad(dialect, db_target, bad_row_for_reads(dialect))
    shown_name = "odd\\xffname" if dialect == "sqlite" else "odd"

    listed = run("list")
    assert listed.returncode == 0, listed.stderr
    assert shown_name in listed.stdout and "task_bad" in listed.stdout
    as_json = run("list", "--json")
    assert as_json.returncode == 0, as_json.stderr
    rows = {row["id"]: row for row in json.loads(as_json.stdout)}
    assert rows["task_bad"]["name"] == shown_name
    assert rows["task_bad"]["payload"]["undecodable"]
    assert rows["task_bad"]["payload"]["raw"].startswith(
        '{"a":"\\xff' if dialect == "sqlite" else "[[[["
    )

    inspected = run("inspect", "task_bad")
    assert inspected.returncode == 0, inspected.stderr
    assert f"name: {shown_name}" in inspected.stdout
    assert '"undecodable"' in inspected.stdout
    inspected_json = run("inspect", "--json", "task_bad")
    assert inspected_json.returncode == 0, inspected_json.stderr
    task = json.loads(inspected_json.stdout)
    assert len(task["payload"]["raw"]) < 300  # the text, cut short to stay readable

    stats = run("stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["default"]["queued"] == 2
