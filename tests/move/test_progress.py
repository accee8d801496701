"""What `cairnqd move-to` shows while it copies: a bar on a terminal, lines elsewhere.
The move calls the view once before a table's first batch (with what earlier runs did),
after each batch, and at the table's end."""

from __future__ import annotations

import io

from cairnqd.cli.move import ProgressView


def test_a_terminal_gets_one_redrawn_bar_with_rate_and_eta() -> None:
    out = io.StringIO()
    view = ProgressView(out, 1_000, tty=True)
    view("cairnq_tasks", 0, 900)
    view("cairnq_tasks", 250, 900)
    view("cairnq_tasks", 900, 900)
    view("cairnq_tasks", 900, 900)  # a table's end is shown once
    view("cairnq_task_keys", 0, 100)
    view("cairnq_task_keys", 100, 100)
    view.end()
    frames = out.getvalue().split("\r")[1:]
    assert len(frames) == 5
    assert "25% 250/1,000 rows" in frames[1]
    assert " rows/s ETA " in frames[1] and "cairnq_tasks" in frames[1]
    assert "ETA --:--" not in frames[1]
    assert "[" + "#" * 30 + "] 100% 1,000/1,000 rows" in frames[-1]
    assert out.getvalue().endswith("\n")


def test_elsewhere_a_line_per_table_and_no_control_characters() -> None:
    out = io.StringIO()
    view = ProgressView(out, 1_000, tty=False)
    view("cairnq_tasks", 0, 900)
    view("cairnq_tasks", 900, 900)
    view("cairnq_tasks", 900, 900)
    view("cairnq_task_keys", 0, 100)
    view("cairnq_task_keys", 100, 100)
    view.end()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("move: cairnq_tasks 900/900; 900/1,000 rows in all, ")
    assert " rows/s, ETA " in lines[0]
    assert lines[1].startswith("move: cairnq_task_keys 100/100; 1,000/1,000 rows in all")
    assert "\r" not in out.getvalue()


def test_a_resumed_move_counts_only_this_runs_rows_in_its_rate() -> None:
    out = io.StringIO()
    view = ProgressView(out, 1_000, tty=False)
    view.started -= 10  # ten seconds into this run
    view("cairnq_tasks", 900, 900)  # done by an earlier run: not shown
    view("cairnq_task_keys", 0, 100)
    view("cairnq_task_keys", 100, 100)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("move: cairnq_task_keys 100/100; 1,000/1,000 rows in all")
    rate = int(lines[0].split("rows in all, ")[1].split(" rows/s")[0].replace(",", ""))
    assert rate <= 11  # 100 rows in about 10 s, not 1,000
