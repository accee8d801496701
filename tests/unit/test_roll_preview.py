"""What `reload --wait` says a reload will cut short, from the running daemon's snapshot
and the edited config: rolled, shrunk and removed groups' running tasks, longest first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cairnqd.cli.rollpreview import preview_lines
from tests.support.harness import daemon_config


def _group(name: str, fingerprint: str, processes: int, *children: Any) -> dict[str, Any]:
    return {"name": name, "fingerprint": fingerprint, "processes": processes,
            "shutdown_timeout_s": 30.0, "children": list(children)}  # fmt: skip


def _child(slot: int, *running: tuple[str, str, float], executing: int | None = None) -> Any:
    return {
        "slot": slot,
        "role": "slot",
        "executing": len(running) if executing is None else executing,
        "running": [{"id": i, "name": n, "age_s": a} for i, n, a in running],
    }


def test_rolled_shrunk_and_removed_groups_name_their_running_tasks(tmp_path: Path) -> None:
    edited = daemon_config(
        tmp_path, "sqlite", str(tmp_path / "t.db"),
        groups={"a": {"queues": ["a"], "processes": 1}, "b": {"queues": ["b"], "processes": 1},
                "c": {"queues": ["c"], "processes": 2}},
    )  # fmt: skip
    same_a = edited.group_fingerprint("a")
    snapshot = {
        "groups": [
            _group("a", same_a, 2, _child(0, ("t1", "keep", 5.0)), _child(1, ("t2", "cut", 9.0))),
            _group("b", "changed", 1, _child(0, ("t3", "x", 3.0), ("t4", "y", 112.0))),
            _group("c", edited.group_fingerprint("c"), 2, _child(0, ("t5", "z", 1.0))),
            _group("gone", "f", 1, _child(0, ("t6", "w", 2.0), executing=3)),
        ]
    }
    lines = preview_lines(snapshot, edited, roll_all=False)
    assert lines == [
        "group a: shrinking it will interrupt 1 running task unless it finishes within its "
        "shutdown_timeout (30s):",
        "  t2 cut (running 9.0s)",
        "group b: rolling it will interrupt 2 running tasks unless they finish within its "
        "shutdown_timeout (30s):",
        "  t4 y (running 1m52s)",
        "  t3 x (running 3.0s)",
        "group gone: removing it will interrupt 3 running tasks unless they finish within "
        "its shutdown_timeout (30s):",
        "  t6 w (running 2.0s)",
        "  and 2 more",
    ]
    # --all rolls every group, whatever its fingerprint.
    rolled = preview_lines(snapshot, edited, roll_all=True)
    heads = [line.split(" unless")[0] for line in rolled if line.startswith("group")]
    assert heads == [
        "group a: rolling it will interrupt 2 running tasks",
        "group b: rolling it will interrupt 2 running tasks",
        "group c: rolling it will interrupt 1 running task",
        "group gone: removing it will interrupt 3 running tasks",
    ]
