"""The task page's attempt timeline over real HTTP, served by a real daemon, on SQLite
and Postgres: the attempts in order with outcome, worker, host and duration, the
traceback folded, the leftover error labelled, and the strict CSP kept."""

from __future__ import annotations

import re
import socket

import pytest

from cairnqd import CairnQ
from cairnqd.dashboard.server import CSP
from tests.dashboard.conftest import Dash
from tests.support.attempts import FIRST_WORKER, LAST_WORKER, LOST_WORKER, failed_lost_succeeded


def _timeline(text: str) -> str:
    start = text.index("<h2>Attempts</h2>")
    return text[start : text.index("<h2>Metadata</h2>", start)]


@pytest.mark.timing
def test_task_page_shows_the_attempts(dash: Dash) -> None:
    http = dash.http()

    # Run by the daemon: one failed attempt, its host this machine's name.
    failed = http.get(f"/task/{dash.tasks['failed']}")
    assert failed.status == 200
    assert failed.headers["content-security-policy"] == CSP
    timeline = _timeline(failed.text)
    assert timeline.count('<li class="attempt">') == 1
    assert '<span class="status outcome oc-failed" title="the handler raised' in timeline
    assert f" on {socket.gethostname()} · " in timeline
    assert '<details class="trace" id="attempt-1-trace"><summary>Traceback</summary>' in timeline
    assert "Traceback (most recent call last)" in timeline
    assert "&lt;i&gt;boom&lt;/i&gt;" in timeline and "<i>boom" not in timeline
    assert "<script>" not in failed.text
    # Not run: nothing recorded, said plainly.
    canceled = http.get(f"/task/{dash.tasks['canceled']}").text
    assert "No attempt recorded" in _timeline(canceled)
    running = _timeline(http.get(f"/task/{dash.tasks['running']}").text)
    assert ">running</span>" in running and " so far" in running

    # Failed, then lost its lease, then succeeded (queue default: no daemon claims it).
    async def history(q: CairnQ) -> str:
        return await failed_lost_succeeded(q.store)

    task_id = dash.run(history)
    page = http.get(f"/task/{task_id}").text
    assert "The error left by attempt 1; the task succeeded afterwards." in page
    assert "<dd>3/5</dd>" in page
    items = re.findall(r'<li class="attempt">(.*?)</li>', _timeline(page), re.S)
    assert len(items) == 3
    assert "#1" in items[0] and ">failed</span>" in items[0] and FIRST_WORKER in items[0]
    assert " on hostA · " in items[0] and "bad pixel" in items[0]
    assert ">lease_lost</span>" in items[1] and LOST_WORKER in items[1]
    assert " on unknown host · " in items[1] and "<details" not in items[1]
    assert ">succeeded</span>" in items[2] and LAST_WORKER in items[2]
    assert " ended " in items[2]
