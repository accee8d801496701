"""The Workers page lists each group's running tasks, longest first: what a roll or a
stop cuts short past the group's shutdown_timeout. Rendered from the snapshot alone,
what it holds escaped; a report for other hosts too long for its row drops the lists."""

from __future__ import annotations

import json
from typing import Any

from cairnqd.dashboard.data import HostView, Overview, report_json
from cairnqd.dashboard.pages import workers_page
from cairnqd.store.browse import REPORT_MAX_CHARS


def _child(pid: int, *running: dict[str, Any]) -> dict[str, Any]:
    return {"pid": pid, "slot": 0, "role": "slot", "generation": 1, "state": "ready",
            "rss": 1, "executing": len(running), "held": 0, "uptime_s": 5.0, "lag_s": 0.0,
            "longest": running[0] if running else None, "worker_id": "w",
            "running": list(running)}  # fmt: skip


def _page(*children: dict[str, Any]) -> str:
    group = {"name": "reports", "state": "running", "ready": 1, "processes": 1,
             "shutdown_timeout_s": 30.0, "children": list(children)}  # fmt: skip
    view = {"pid": 1, "generation": 1, "uptime_s": 9.0, "groups": [group]}
    overview = Overview(
        taken_at_ms=0, queues=[], failed_groups=[], schedules={}, daemon=view,
        daemon_note=None, hosts=[HostView("h/1", "h", view)],
    )  # fmt: skip
    return str(workers_page(overview))


def test_running_tasks_are_listed_longest_first_with_the_group_s_timeout() -> None:
    page = _page(
        _child(11, {"id": "t_short", "name": "mail.send", "age_s": 3.0}),
        _child(12, {"id": "t_long", "name": "<b>report</b>", "age_s": 112.0}),
    )
    assert "shutdown_timeout (30s)" in page
    listing = page[page.index('class="grid running"') :]
    assert listing.index("t_long") < listing.index("t_short")
    assert '<a href="/task/t_long">t_long</a></td><td>&lt;b&gt;report&lt;/b&gt;</td>' in listing
    assert '<td>reports</td><td class="num">1m 52s</td><td class="num">12</td>' in listing
    assert "<b>report</b>" not in page


def test_no_running_task_no_listing() -> None:
    assert 'class="grid running"' not in _page(_child(11))


def test_a_report_too_long_for_its_row_leaves_the_running_lists_out() -> None:
    busy = [{"id": f"task_{i:026d}", "name": "n" * 200, "age_s": 1.0} for i in range(16)]
    children = [_child(pid, *busy) for pid in range(300)]
    view = {"pid": 1, "groups": [{"name": "g", "children": children}], "removed_groups": []}
    small = {"pid": 1, "groups": [{"name": "g", "children": [_child(1, *busy[:1])]}]}
    assert json.loads(report_json(small)) == small
    text = report_json(view)
    assert len(text) <= REPORT_MAX_CHARS
    stored = json.loads(text)
    assert [len(c["running"]) for c in stored["groups"][0]["children"]] == [0] * 300
    assert stored["groups"][0]["children"][5]["executing"] == 16
    assert len(view["groups"][0]["children"][0]["running"]) == 16, "the view is left alone"
