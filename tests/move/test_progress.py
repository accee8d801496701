"""What `cairnqd move-to` shows while it copies: a bar on a terminal, lines elsewhere."""

from __future__ import annotations

import io

from cairnqd.cli.move import ProgressView


def test_a_terminal_gets_one_redrawn_bar_with_rate_and_eta() -> None:
    out = io.StringIO()
    view = ProgressView(out, 1_000, tty=True)
    view("cairnq_tasks", 250, 900)
    view("cairnq_tasks", 900, 900)
    view("cairnq_tasks", 900, 900)  # a table's end is shown once
    view("cairnq_task_keys", 100, 100)
    view.end()
    frames = out.getvalue().split("\r")[1:]
    assert len(frames) == 3
    assert "25% 250/1,000 rows" in frames[0]
    assert "rows/s ETA " in frames[0] and "cairnq_tasks" in frames[0]
    assert "[" + "#" * 30 + "] 100% 1,000/1,000 rows" in frames[-1]
    assert out.getvalue().endswith("\n")


def test_elsewhere_a_line_per_table_and_no_control_characters() -> None:
    out = io.StringIO()
    view = ProgressView(out, 1_000, tty=False)
    view("cairnq_tasks", 900, 900)
    view("cairnq_tasks", 900, 900)
    view("cairnq_task_keys", 100, 100)
    view.end()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("move: cairnq_tasks 900/900; 900/1,000 rows in all, ")
    assert "rows/s, ETA " in lines[0]
    assert lines[1].startswith("move: cairnq_task_keys 100/100; 1,000/1,000 rows in all")
    assert "\r" not in out.getvalue()
