"""`cairnqd list`, `inspect` and `stats` on text another client stored with control
characters in it: a name, queue, message or error holding an escape sequence, a tab, a
carriage return or a newline (the protocol's text columns take any text). Each is
shown escaped (`\\x1b`, `\\t`), so nothing the database holds is sent to the terminal
as a command, and a table row stays one line. JSON output was valid all along.

Before, `cairnqd stats` printed such a queue name as it was: `\\x1b[31m` turned the
operator's terminal red, and a `\\r` overwrote the start of the row."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import Run
from tests.support.store import query

ESC = "\x1b[31m"
ODD_NAME = "job\tname\nnext" + ESC
ODD_QUEUE = "q\r" + ESC
ODD_MESSAGE = "half\x1b]0;title\x07"


def _target(config: Path) -> tuple[str, str]:
    text = config.read_text()
    line = next(x.strip() for x in text.splitlines() if x.strip().startswith(("path:", "dsn:")))
    kind, value = line.split(":", 1)
    return ("sqlite" if kind == "path" else "postgres"), json.loads(value.strip())


def _no_control(text: str) -> None:
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text, repr(text)


def test_stored_control_characters_are_shown_escaped(db_config: Path, run: Run) -> None:
    dialect, target = _target(db_config)
    made = run("submit", "demo.echo", "--payload", '{"x": 1}')
    assert made.returncode == 0, made.stderr
    task_id = made.stdout.strip()
    error = json.dumps({"type": "E", "code": "c", "message": "bad" + ESC, "retryable": False})
    # As another client would write it: plain SQL on the row.
    query(
        dialect,
        target,
        "update cairnq_tasks set name = ?, queue = ?, message = ?, error = ? where id = ?",
        [ODD_NAME, ODD_QUEUE, ODD_MESSAGE, error, task_id],
    )

    listed = run("list")
    assert listed.returncode == 0, listed.stderr
    _no_control(listed.stdout)
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith(task_id)]
    assert "job\\tname\\nnext\\x1b[31m" in row and "q\\r\\x1b[31m" in row
    assert len(listed.stdout.splitlines()) == 2  # the header and one row

    stats = run("stats")
    assert stats.returncode == 0, stats.stderr
    _no_control(stats.stdout)
    assert "q\\r\\x1b[31m" in stats.stdout

    inspected = run("inspect", task_id)
    assert inspected.returncode == 0, inspected.stderr
    _no_control(inspected.stdout)
    assert "name: job\\tname\\nnext\\x1b[31m" in inspected.stdout
    assert "message: half\\x1b]0;title\\x07" in inspected.stdout
    assert "message: bad\\x1b[31m" in inspected.stdout  # the error's

    # JSON output keeps the text as stored, JSON-escaped.
    (as_json,) = json.loads(run("list", "--json").stdout)
    assert as_json["name"] == ODD_NAME and as_json["queue"] == ODD_QUEUE
    shown = json.loads(run("inspect", "--json", task_id).stdout)
    assert shown["message"] == ODD_MESSAGE
