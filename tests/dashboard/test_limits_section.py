"""The overview's Limits section and the task page's reason, rendered from the snapshot's
values alone: absent without limits, the busiest few partitions and never all, the
operator's override and who set it, the bypass warning, and everything escaped."""

from __future__ import annotations

from typing import Any

from cairnqd.dashboard.data import TOP_PARTITIONS, LimitRow, Overview, QueueRow
from cairnqd.dashboard.pages import Viewer, overview_page, task_page
from cairnqd.limits import NO_PARTITION, Override, Rate, parse_limits
from cairnqd.models import Task
from cairnqd.store.tables.limits import (
    Bypass,
    LimitUsage,
    PartitionUsage,
    RoomWait,
    full_budgets,
)

VIEWER = Viewer(session=None, login_required=False, actions=False, refresh_ms=1000)
SMTP, TENANT = parse_limits(
    {
        "smtp": {"queues": ["email"], "concurrency": 3, "rate": "10/1s"},
        "tenant": {"queues": ["jobs"], "concurrency": 1, "partition_by": "payload.t"},
    }
)


def _queue(name: str) -> QueueRow:
    counts = dict.fromkeys(("queued", "running", "succeeded", "failed", "canceled"), 0)
    return QueueRow(name, counts, None, None, [(0, 0)] * 60)


def _overview(**kw: Any) -> Overview:
    return Overview(
        taken_at_ms=0,
        queues=[_queue("email"), _queue("jobs")],
        failed_groups=[],
        schedules={},
        daemon=None,
        daemon_note="no daemon answers",
        **kw,
    )


def _row(queue: str, text: str) -> str:
    """The overview's table row of one queue."""
    start = text.index(f">{queue}</a></th>")
    return text[start : text.index("</tr>", start)]


def test_no_limits_no_section() -> None:
    page = str(overview_page(_overview(), VIEWER))
    assert "<h2>Limits</h2>" not in page and "throttled by" not in page


def test_a_full_limit_is_shown_and_marks_its_queue() -> None:
    smtp = LimitUsage(SMTP, (PartitionUsage(NO_PARTITION, in_use=3, starts=10, waiting=4,
                                            window_frees_in_ms=120),))  # fmt: skip
    row = LimitRow.of(smtp, SMTP, None)
    assert row.full == 1
    page = str(overview_page(_overview(limits=[row], throttled={"email": ["smtp"]}), VIEWER))
    assert "<h2>Limits</h2>" in page
    assert '<td class="num">3/3</td><td class="num">10/10 per 1s</td>' in page
    assert '<td class="num">4</td><td class="num">120 ms</td>' in page
    assert "queues email" in page
    assert "throttled by smtp" in _row("email", page)
    assert "throttled by" not in _row("jobs", page)


def test_room_left_shows_no_mark() -> None:
    smtp = LimitUsage(SMTP, (PartitionUsage(NO_PARTITION, in_use=2, starts=3, waiting=4),))
    row = LimitRow.of(smtp, SMTP, None)
    assert row.full == 0
    page = str(overview_page(_overview(limits=[row]), VIEWER))
    assert "<h2>Limits</h2>" in page and "throttled" not in page
    assert '<span class="running">room</span>' in page


def test_partitions_are_summarised_busiest_first_and_escaped() -> None:
    parts = tuple(PartitionUsage(f"t{i:02d}", in_use=1, waiting=i) for i in range(20))
    parts += (PartitionUsage("<b>evil</b>", in_use=1, waiting=100),)
    row = LimitRow.of(LimitUsage(TENANT, parts), TENANT, None)
    assert len(row.top) == TOP_PARTITIONS and row.partitions == 21 and row.full == 21
    page = str(overview_page(_overview(limits=[row]), VIEWER))
    assert page.count('<tr class="part"><th') == TOP_PARTITIONS
    assert "&lt;b&gt;evil&lt;/b&gt;" in page and "<b>evil</b>" not in page
    assert "t19" in page and "t00" not in page  # the busiest, not the first by name
    hidden_waiting = sum(range(20 - (TOP_PARTITIONS - 1)))
    assert f"and 16 more partitions ({hidden_waiting} tasks waiting)" in page
    assert "21 of 21 partitions full" in page


def test_an_override_names_who_set_it_and_the_configs_value() -> None:
    kept = parse_limits({"smtp": {"queues": ["email"], "concurrency": 1, "rate": "10/1s"}})[0]
    override = Override("smtp", 1, None, set_by="ops@<host>", set_at_ms=0, reason="relay slow")
    row = LimitRow.of(LimitUsage(kept, ()), SMTP, override)
    page = str(overview_page(_overview(limits=[row]), VIEWER))
    assert "overridden by ops@&lt;host&gt;" in page and ": relay slow" in page
    assert "the config says concurrency 3, rate 10/1s" in page
    assert '<td class="num">0/1</td>' in page


def test_a_bypass_is_a_warning() -> None:
    row = LimitRow.of(LimitUsage(SMTP, ()), SMTP, None)
    bypass = Bypass("smtp", "task_1", "<i>send</i>", "sdk-worker")
    page = str(overview_page(_overview(limits=[row], bypasses=[bypass]), VIEWER))
    assert 'role="alert"' in page and "Tasks running outside a limit" in page
    assert 'href="/task/task_1"' in page and "claimed by worker sdk-worker" in page
    assert "&lt;i&gt;send&lt;/i&gt;" in page
    quiet = str(overview_page(_overview(limits=[row]), VIEWER))
    assert "Tasks running outside a limit" not in quiet


def test_the_task_page_says_what_it_waits_for() -> None:
    task = Task(id="task_1", name="send", queue="jobs", status="queued")
    wait = full_budgets(TENANT, PartitionUsage("<acme>", in_use=1))
    assert wait == [RoomWait("tenant", "<acme>", "concurrency", 1, 1, partitioned=True)]
    page = str(task_page(task, None, VIEWER, wait))
    assert "Waiting for room" in page
    assert "waiting for room in limit tenant (partition &lt;acme&gt;): 1/1 running" in page
    assert "Waiting for room" not in str(task_page(task, None, VIEWER))


def test_a_rate_wait_says_when_the_window_opens() -> None:
    limit = parse_limits({"api": {"queues": ["a"], "rate": "200/1s"}})[0]
    assert limit.rate == Rate(200, 1000)
    (wait,) = full_budgets(limit, PartitionUsage(NO_PARTITION, starts=200, window_frees_in_ms=120))
    assert wait.describe() == "waiting for room in limit api: rate 200/1s full; opens in 120 ms"
    assert full_budgets(limit, PartitionUsage(NO_PARTITION, starts=199)) == []
