"""Actions over real HTTP on SQLite and Postgres: each goes back to the page it came
from with a one-shot flash message, never to another site; bulk actions on a selection
and on a filter (after a confirmation page with the count); a viewer's login refused."""

from __future__ import annotations

import html
import re
from urllib.parse import quote

from cairnqd import CairnQ
from tests.dashboard.conftest import VIEWER_TOKEN, Dash


def _parked(dash: Dash, n: int) -> list[str]:
    """`n` tasks on a queue no worker serves: they stay queued."""

    async def submit(q: CairnQ) -> list[str]:
        return [(await q.submit("d.echo", {"i": i}, queue="parked")).id for i in range(n)]

    ids: list[str] = dash.run(submit)
    return ids


def test_an_action_goes_back_with_a_flash_shown_once(dash: Dash) -> None:
    http = dash.http()
    (task_id,) = _parked(dash, 1)
    back = f"/task/{task_id}"
    csrf = http.get(back).csrf()
    done = http.post("/actions/task-cancel", {"id": task_id, "csrf": csrf, "next": back})
    assert done.status == 303 and done.headers["location"] == back
    assert "flash" in (http.cookie or "")
    page = http.follow(done)
    assert f'<div id="flash" class="flash ok" role="status">{task_id} canceled</div>' in page.text
    assert "flash" not in (http.cookie or "")  # the page that showed it ended it
    assert 'id="flash"' not in http.get(back).text
    assert dash.status(task_id) == "canceled"

    # A live page's re-read does not take the message meant for the page it goes to.
    again = http.post("/actions/task-retry", {"id": task_id, "csrf": csrf, "next": back})
    live = http.get(back, headers={"X-Requested-With": "cairnqd-live"})
    assert live.status == 200 and 'id="flash"' not in live.text
    assert f"{task_id} queued again" in http.flash(again)

    # An error comes back the same way, marked as one.
    wrong = http.post("/actions/task-retry", {"id": "not an id", "csrf": csrf, "next": back})
    assert wrong.headers["location"] == back
    page = http.follow(wrong)
    assert re.search(r'class="flash error" role="alert">Not done: task id: ', page.text)

    # A flash cookie the dashboard did not sign is not shown.
    forged = http.get(back, headers={"Cookie": f"{http.cookie}; cairnqd_flash=ok.SGk.00"})
    assert forged.status == 200 and 'id="flash"' not in forged.text


def test_an_action_never_redirects_to_another_site(dash: Dash) -> None:
    http = dash.http()
    csrf = http.get("/").csrf()
    for outside in (
        "https://evil.example/",
        "//evil.example/",
        "/\\evil.example",
        "/\t/evil.example",
        "http:/evil.example",
        "/nowhere",
    ):
        reply = http.post(
            "/actions/queue-resume", {"queue": "parked", "csrf": csrf, "next": outside}
        )
        assert reply.status == 303 and reply.headers["location"] == "/", outside
        assert "was not paused" in http.flash(reply)
    assert "not a page of this dashboard, going to / instead" in dash.daemon.output()
    # Nor does the login's.
    anonymous = dash.http(login=False)
    login = anonymous.post(
        "/login", {"who": "a", "token": "dashboard-test-token-0123456789", "next": "//evil"}
    )
    assert login.status == 303 and login.headers["location"] == "/"


def test_cancel_and_retry_a_selection(dash: Dash) -> None:
    ids = _parked(dash, 3)
    http = dash.http()
    listing = http.get("/tasks?queue=parked")
    for task_id in ids:
        assert f'<input type="checkbox" name="id" value="{task_id}"' in listing.text
    csrf = listing.csrf()
    back = "/tasks?queue=parked"
    form = f"op=cancel&csrf={csrf}&next={quote(back)}&" + "&".join(f"id={i}" for i in ids)
    done = http.request(
        "POST",
        "/actions/tasks-selected",
        body=form.encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert done.status == 303 and done.headers["location"] == back
    assert http.flash(done) == "Canceled 3 task(s) of the selected"
    assert [dash.status(i) for i in ids] == ["canceled"] * 3

    one = http.post(
        "/actions/tasks-selected", {"op": "retry", "id": ids[0], "csrf": csrf, "next": back}
    )
    assert http.flash(one) == f"Retried task {ids[0]}"
    assert dash.status(ids[0]) == "queued"
    # A task not in a status the action changes is left alone, and said so.
    both = f"op=retry&csrf={csrf}&next=%2Ftasks&id={ids[0]}&id={ids[1]}"
    mixed = http.request(
        "POST",
        "/actions/tasks-selected",
        body=both.encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert http.flash(mixed) == (
        "Retried 1 task(s) of the selected; 1 had changed status and were left alone"
    )
    none = http.post("/actions/tasks-selected", {"op": "cancel", "csrf": csrf, "next": back})
    assert "Not done: no task selected" in http.flash(none)
    bogus = http.post(
        "/actions/tasks-selected", {"op": "purge", "id": ids[2], "csrf": csrf, "next": back}
    )
    assert "Not done: op: must be cancel or retry" in http.flash(bogus)
    assert dash.status(ids[2]) == "canceled"


def test_cancel_all_matching_after_a_confirmation(dash: Dash) -> None:
    ids = _parked(dash, 4)
    http = dash.http()
    listing = http.get("/tasks?status=queued&queue=parked")
    link = re.search(r'href="(/bulk\?[^"]+)">Cancel all matching', listing.text)
    assert link is not None, listing.text[:3000]
    assert "Retry all matching" not in listing.text  # queued tasks cannot be retried
    confirm = http.get(link.group(1).replace("&amp;", "&"))
    assert confirm.status == 200
    assert '<b class="bulk-count">4</b> matching task(s): status queued, queue parked?' in (
        confirm.text
    )
    assert all(dash.status(i) == "queued" for i in ids)  # asking does nothing
    form = confirm.text[confirm.text.index('action="/actions/tasks-matching"') :]
    found = re.findall(r'name="(\w+)" value="([^"]*)"', form[: form.index("</form>")])
    fields = {k: html.unescape(v) for k, v in found}
    assert fields["count"] == "4" and fields["op"] == "cancel"
    done = http.post("/actions/tasks-matching", fields)
    assert done.headers["location"] == "/tasks?status=queued&queue=parked"
    assert http.flash(done) == "Canceled 4 task(s) matching status queued, queue parked"
    assert [dash.status(i) for i in ids] == ["canceled"] * 4
    assert dash.status(dash.tasks["queued"]) == "queued"  # another queue: untouched

    # Retry them all back, from a filter on the canceled ones.
    retry = http.get("/bulk?op=retry&status=canceled&queue=parked")
    assert '<b class="bulk-count">5</b>' in retry.text  # with the seed's canceled one
    # Nothing to do: no confirmation form.
    empty = http.get("/bulk?op=cancel&queue=nothing-here")
    assert "Nothing to do." in empty.text and "tasks-matching" not in empty.text
    # Everything at once is never offered, nor a status the action cannot change.
    assert http.get("/bulk?op=cancel").status == 400
    assert "filter the list first" in http.get("/bulk?op=retry").text
    assert http.get("/bulk?op=cancel&status=failed").status == 400
    assert "Cancel all matching" not in http.get("/tasks").text  # no filter, no offer


def test_a_viewer_sees_every_page_and_may_do_nothing(dash: Dash) -> None:
    viewer = dash.http(login=False)
    viewer.login(token=VIEWER_TOKEN, who="vera")
    assert "vera logged in from 127.0.0.1 as viewer" in dash.daemon.output()
    pages = ["/", "/tasks", "/failed", "/workers", "/schedules", "/search?q=d."]
    pages += [f"/task/{t}" for t in dash.tasks.values()]
    for path in pages:
        page = viewer.get(path)
        assert page.status == 200, path
        assert "/actions/" not in page.text, path
        assert 'type="checkbox"' not in page.text and "all matching" not in page.text, path
        assert "vera (read-only)" in page.text
    csrf = viewer.get("/").csrf()  # the logout form carries one
    failed, queued = dash.tasks["failed"], dash.tasks["queued"]
    forms = {
        "task-retry": {"id": failed},
        "task-cancel": {"id": queued},
        "queue-pause": {"queue": "work"},
        "queue-resume": {"queue": "work"},
        "schedule-trigger": {"schedule": "nightly"},
        "failed-retry": {"name": "d.fail", "error_type": "ValueError"},
        "failed-discard": {"name": "d.fail", "error_type": "ValueError"},
        "tasks-selected": {"op": "cancel", "id": queued},
        "tasks-matching": {"op": "cancel", "queue": "work"},
    }
    for action, form in forms.items():
        reply = viewer.post(f"/actions/{action}", {**form, "csrf": csrf, "next": "/"})
        assert reply.status == 403 and "read-only" in reply.text, action
    assert dash.status(failed) == "failed" and dash.status(queued) == "queued"
    assert "dashboard action task-retry by vera from 127.0.0.1 (): refused: a read-only" in (
        dash.daemon.output()
    )
    # The operator, beside, still acts.
    operator = dash.http()
    assert "/actions/task-retry" in operator.get(f"/task/{failed}").text
    assert viewer.post("/logout", {"csrf": csrf}).status == 303
