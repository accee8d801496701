"""The header's search box over real HTTP on SQLite and Postgres: an id opens its task;
a key prefix, a task name or text inside a payload lists tasks; the newest
`dashboard.search_scan` tasks are looked through, and the page says when that cut the
search short."""

from __future__ import annotations

import re
from urllib.parse import quote

from cairnqd import CairnQ
from tests.dashboard.conftest import SCRIPT_RAW, SEARCH_SCAN, Dash, Http

_IDS = re.compile(r'href="/task/(task_[0-9A-Z]+)"')


def _found(http: Http, text: str) -> list[str]:
    page = http.get("/search?q=" + quote(text))
    assert page.status == 200, page.text[:500]
    body = page.text[page.text.index('<main id="page"') :]
    return _IDS.findall(body)


def test_an_id_opens_its_task(dash: Dash) -> None:
    http = dash.http()
    task_id = dash.tasks["failed"]
    reply = http.get("/search?q=" + task_id)
    assert reply.status == 303 and reply.headers["location"] == f"/task/{task_id}"
    bare = http.get("/search?q=" + task_id.removeprefix("task_").lower())  # a bare ULID
    assert bare.status == 303 and bare.headers["location"] == f"/task/{task_id}"
    lower = http.get("/search?q=" + task_id.lower())
    assert lower.status == 303 and lower.headers["location"] == f"/task/{task_id}"
    # An id no task has is searched as text, and nothing matches.
    missing = http.get("/search?q=task_01JZZZZZZZZZZZZZZZZZZZZZZZ")
    assert missing.status == 200 and "No task matches." in missing.text


def test_a_key_prefix_a_name_or_payload_text(dash: Dash) -> None:
    http = dash.http()
    assert _found(http, "key-<") == [dash.tasks["queued"]]  # the start of a key
    assert _found(http, "d.fa") == [dash.tasks["failed"]]  # the start of a name
    assert _found(http, "HALFWAY <b") == [dash.tasks["running"]]  # payload, any case
    both = _found(http, "window.__xss = 1")  # two payloads hold it
    assert sorted(both) == sorted([dash.tasks["queued"], dash.tasks["succeeded"]])
    page = http.get("/search?q=" + quote("<script>window.__xss"))
    assert SCRIPT_RAW not in page.text  # what was asked is escaped where it is shown
    assert 'value="&lt;script&gt;window.__xss"' in page.text
    assert "<td>key-&lt;1&gt;</td>" in http.get("/search?q=key-").text
    assert "Searched the newest" not in page.text  # the table is smaller than the window
    assert http.get("/search").status == 200
    assert http.get("/search?q=a&x=1").status == 400


def test_the_search_looks_through_the_newest_tasks_only(dash: Dash) -> None:
    async def submit(q: CairnQ) -> list[str]:
        return [(await q.submit("d.echo", {"n": i}, queue="parked")).id for i in range(6)]

    newer = dash.run(submit)
    assert len(newer) == SEARCH_SCAN
    http = dash.http()
    # The failed task is older than the newest six now: not looked at, and said so.
    page = http.get("/search?q=d.fail")
    assert "No task matches." in page.text
    assert f"Searched the newest {SEARCH_SCAN} tasks only" in page.text
    assert set(_found(http, "d.echo")) == set(newer)
    # An exact key still finds its task however old it is.
    assert _found(http, "key-<1>") == [dash.tasks["queued"]]
