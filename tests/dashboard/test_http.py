"""The dashboard over real HTTP, served by a real daemon, on SQLite and Postgres."""

from __future__ import annotations

import concurrent.futures
import re
import socket
from pathlib import Path
from urllib.parse import quote

import pytest

from cairnqd import CairnQ, __version__
from cairnqd.dashboard.server import CSP
from tests.dashboard.conftest import (
    SCRIPT_RAW,
    TOKEN,
    XSS_QUEUE,
    Dash,
    Http,
    dashboard_config,
)
from tests.support.cli import cli
from tests.support.daemon import Daemon, write_config
from tests.support.waiting import wait_for

PAGES = ("/", "/tasks", "/failed", "/workers", "/schedules")


def test_every_page_renders_with_tasks_in_every_status(dash: Dash) -> None:
    http = dash.http()
    overview = http.get("/")
    assert overview.status == 200
    # The totals strip counts one task of each status.
    for status in ("queued", "running", "succeeded", "failed", "canceled"):
        assert re.search(rf"<b>1</b> {status}</a>", overview.text), status
    assert ">work</a>" in overview.text and ">parked</a>" in overview.text
    assert f"pid {dash.daemon.pid}, this host, live" in overview.text
    assert '<th scope="row">w</th>' in overview.text
    assert "<h2>Limits</h2>" not in overview.text  # the config has no limits

    tasks = http.get("/tasks")
    assert tasks.status == 200
    for task_id in dash.tasks.values():
        assert f'href="/task/{task_id}"' in tasks.text

    for status, task_id in dash.tasks.items():
        page = http.get(f"/task/{task_id}")
        assert page.status == 200, page.text[:500]
        assert f'<span class="status st-{status}">{status}</span>' in page.text

    failed = http.get(f"/task/{dash.tasks['failed']}")
    assert "ValueError" in failed.text and "Traceback (most recent call last)" in failed.text
    assert "&lt;i&gt;boom&lt;/i&gt;" in failed.text
    running = http.get(f"/task/{dash.tasks['running']}")
    assert 'progress max="1" value="0.5000"' in running.text
    assert "halfway &lt;b&gt;" in running.text and "data-live=" in running.text
    queued = http.get(f"/task/{dash.tasks['queued']}")
    assert "<dd>key-&lt;1&gt;</dd>" in queued.text

    groups = http.get("/failed")
    assert groups.status == 200 and ">d.fail</a>" in groups.text and ">ValueError<" in groups.text
    workers = http.get("/workers")
    assert workers.status == 200 and "executing" in workers.text
    # The worker child of group w shows with its pid.
    (pid,) = dash.daemon.children("w")
    assert f'<td class="num">{pid}</td>' in workers.text
    schedules = http.get("/schedules")
    assert schedules.status == 200 and ">nightly</th>" in schedules.text
    assert "03:00:00" in schedules.text


def test_headers_on_every_page(dash: Dash) -> None:
    http = dash.http()
    for path in (*PAGES, f"/task/{dash.tasks['queued']}", "/tasks?status=nope", "/nowhere"):
        reply = http.get(path)
        assert reply.headers["content-security-policy"] == CSP, path
        assert "default-src 'self'" in CSP and "unsafe-inline" not in CSP
        assert reply.headers["x-content-type-options"] == "nosniff"
        assert reply.headers["x-frame-options"] == "DENY"
        assert reply.headers["cache-control"] == "no-store"
        # No inline script or style anywhere: the CSP would block it.
        assert not re.search(r"<script(?![^>]*\bsrc=)", reply.text), path
        assert " style=" not in reply.text and "<style" not in reply.text, path
        assert " on" + "click=" not in reply.text


def test_user_data_is_escaped_everywhere(dash: Dash) -> None:
    http = dash.http()
    pages = [http.get(p).text for p in PAGES]
    pages += [http.get(f"/task/{t}").text for t in dash.tasks.values()]
    pages.append(http.get("/tasks?" + "queue=" + quote(XSS_QUEUE)).text)
    for text in pages:
        assert SCRIPT_RAW not in text
        assert "<img src=x" not in text
        assert 'onmouseover="' not in text
    queued = http.get(f"/task/{dash.tasks['queued']}").text
    assert "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in queued
    assert "&lt;script&gt;window.__xss=4&lt;/script&gt;" in queued  # the name
    assert "q&lt;b&gt;x" in http.get("/").text  # the queue's name


def test_no_secret_in_any_page(dash: Dash) -> None:
    http = dash.http()
    texts = [http.get(p).text for p in PAGES]
    for text in texts:
        assert TOKEN not in text
        if dash.dialect == "postgres":
            assert dash.target not in text and "postgresql://" not in text
    assert TOKEN not in (http.cookie or "")


def test_filters_and_keyset_paging(dash: Dash) -> None:
    async def more(q: CairnQ) -> list[tuple[int, str]]:
        made = [await q.submit("d.echo", {"i": i}, queue="parked") for i in range(7)]
        return [(t.created_at_ms, t.id) for t in made]

    made = dash.run(more)
    ids = {task_id for _, task_id in made}
    http = dash.http()
    seen: list[str] = []
    path = "/tasks?queue=parked&status=queued&limit=3"
    pages = 0
    while path:
        reply = http.get(path)
        assert reply.status == 200, reply.text[:500]
        seen += re.findall(r'href="/task/(task_[0-9A-Z]+)"', reply.text)
        found = re.search(r'rel="next" href="([^"]+)"', reply.text)
        path = found.group(1).replace("&amp;", "&") if found else ""
        pages += 1
    assert pages == 3
    assert len(seen) == len(set(seen)) == 7
    assert set(seen) == ids
    # Newest first: created_at_ms, then id. Not the ids alone: two submits within one
    # millisecond get ULIDs in random order, and the database's clock stamps
    # created_at_ms, not the one in the ULID (CI once saw the two disagree).
    assert seen == [task_id for _, task_id in sorted(made, reverse=True)]

    by_status = http.get("/tasks?status=failed")
    assert re.findall(r'href="/task/(task_[0-9A-Z]+)"', by_status.text) == [dash.tasks["failed"]]
    by_key = http.get("/tasks?key=" + quote("key-<1>"))
    assert re.findall(r'href="/task/(task_[0-9A-Z]+)"', by_key.text) == [dash.tasks["queued"]]
    by_name = http.get("/tasks?name=d.fail&sort=finished")
    assert re.findall(r'href="/task/(task_[0-9A-Z]+)"', by_name.text) == [dash.tasks["failed"]]
    future = http.get("/tasks?from=2999-01-01")
    assert "No task matches." in future.text
    window = http.get("/tasks?from=2000-01-01T00:00Z&to=2999-01-01T00:00%2B01:00&sort=run_at")
    assert len(re.findall(r'href="/task/', window.text)) == 12


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("status=done", "status: must be one of"),
        ("sort=priority", "sort: must be one of"),
        ("cursor=%%%", "cursor: not a page cursor"),
        ("cursor=bm90LWEtY3Vyc29y", "cursor: not a page cursor"),
        ("cursor=cnVuX2F0OjE6dGFza194", "cursor: it pages the &#x27;run_at&#x27; sort"),
        ("from=yesterday", "from: &#x27;yesterday&#x27; is not a time"),
        ("from=2026-01-02&to=2026-01-01", "from: must be before to"),
        ("limit=0", "limit: must be a whole number"),
        ("limit=ten", "limit: must be a whole number"),
        ("page=2", "unknown query parameter &#x27;page&#x27;"),
        ("status=queued&status=failed", "given 2 times"),
        ("name=" + "x" * 1200, "longer than 1000 characters"),
        ("queue=%00", "control characters"),
    ],
)
def test_malformed_task_filters_are_400(sqlite_dash: Dash, query: str, message: str) -> None:
    reply = sqlite_dash.http().get(f"/tasks?{query}")
    assert reply.status == 400, reply.text[:300]
    assert message in reply.text


def test_other_bad_inputs(sqlite_dash: Dash) -> None:
    http = sqlite_dash.http()
    assert http.get("/task/not%20an%20id").status == 400
    assert http.get("/task/task_NOPE").status == 404
    assert http.get("/?x=1").status == 400
    assert http.get("/nowhere").status == 404
    assert http.get("/static/../pyproject.toml").status == 404
    assert http.request("PUT", "/").status == 405
    big = http.request(
        "POST", "/actions/task-retry", body=b"x" * 70_000,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )  # fmt: skip
    assert big.status == 413
    plain = http.post("/actions/task-retry", {"id": "x"}, headers={"Content-Type": "text/plain"})
    assert plain.status == 415
    assert http.request("POST", "/actions/task-retry", body=b"id=1").status == 415


def test_login_is_required_with_a_token(sqlite_dash: Dash) -> None:
    anonymous = Http(sqlite_dash.port)
    for path in PAGES:
        reply = anonymous.get(path)
        assert reply.status == 303 and reply.headers["location"].startswith("/login?next=")
    assert anonymous.get("/login").status == 200
    wrong = anonymous.post("/login", {"who": "eve", "token": "x" * 30, "next": "/"})
    assert wrong.status == 403 and "wrong token" in wrong.text and anonymous.cookie is None
    forged = Http(sqlite_dash.port, cookie="cairnqd_dashboard=abc.1.ZXZl.deadbeef")
    assert forged.get("/").status == 303
    assert "login refused for 'eve'" in sqlite_dash.daemon.output()
    # Guessing is throttled: after 5 wrong tokens, even the right one waits a minute.
    for _ in range(4):
        anonymous.post("/login", {"who": "eve", "token": "y" * 30, "next": "/"})
    throttled = anonymous.post("/login", {"who": "eve", "token": TOKEN, "next": "/"})
    assert throttled.status == 429 and anonymous.cookie is None
    # The static files need no login (the login page uses the stylesheet).
    assert anonymous.get("/static/dashboard.css").status == 200


def test_actions_need_login_and_csrf(dash: Dash) -> None:
    failed = dash.tasks["failed"]
    anonymous = Http(dash.port)
    assert anonymous.post("/actions/task-retry", {"id": failed}).status == 403
    http = dash.http()
    page = http.get(f"/task/{failed}")
    no_csrf = http.post("/actions/task-retry", {"id": failed, "next": "/"})
    assert no_csrf.status == 403 and "CSRF" in no_csrf.text
    wrong = http.post("/actions/task-retry", {"id": failed, "csrf": "0" * 64})
    assert wrong.status == 403
    other = dash.http()  # another session's CSRF value does not do either
    stolen = other.post("/actions/task-retry", {"id": failed, "csrf": page.csrf()})
    assert stolen.status == 403
    cross = http.post(
        "/actions/task-retry",
        {"id": failed, "csrf": page.csrf()},
        headers={"Origin": "http://evil.example"},
    )
    assert cross.status == 403
    assert dash.status(failed) == "failed"  # none of them did anything

    done = http.post(
        "/actions/task-retry", {"id": failed, "csrf": page.csrf(), "next": f"/task/{failed}"}
    )
    assert done.status == 303 and done.headers["location"] == f"/task/{failed}"
    assert "queued again" in http.flash(done)
    dash.wait_status(failed, "failed")  # it ran again, and failed again
    log = dash.daemon.output()
    assert "dashboard action task-retry by tester from 127.0.0.1" in log
    assert "refused: missing or wrong CSRF value" in log


def test_each_action_with_the_token(dash: Dash) -> None:
    http = dash.http()
    csrf = http.get("/").csrf()

    def act(action: str, **form: str) -> str:
        reply = http.post(f"/actions/{action}", {**form, "csrf": csrf, "next": "/"})
        assert reply.status == 303 and reply.headers["location"] == "/", reply.text[:500]
        return http.flash(reply)

    assert "paused" in act("queue-pause", queue="parked", reason="<b>maintenance</b>")
    overview = http.get("/").text
    assert "by dashboard:tester" in overview and "&lt;b&gt;maintenance&lt;/b&gt;" in overview
    assert 'id="flash"' not in overview  # shown once, on the page the action went back to
    assert "resumed" in act("queue-resume", queue="parked")

    running = dash.tasks["running"]
    asked = act("task-cancel", id=running)
    assert "cancel is asked" in asked
    assert "its handler is cancelled if it has not returned 10s from now" in asked
    assert dash.release is not None
    dash.release.touch()
    dash.wait_status(running, "canceled")
    assert "queued again" in act("task-retry", id=dash.tasks["canceled"])
    assert dash.status(dash.tasks["canceled"]) == "queued"

    text = act("schedule-trigger", schedule="nightly")
    task_id = re.search(r"(task_[0-9A-Z]+) enqueued now", text)
    assert task_id is not None
    dash.wait_status(task_id.group(1), "succeeded")

    assert "1 failed d.fail task(s) (ValueError) queued again" in act(
        "failed-retry", name="d.fail", error_type="ValueError"
    )
    dash.wait_status(dash.tasks["failed"], "failed")
    assert "1 failed d.fail task(s) (ValueError) deleted" in act(
        "failed-discard", name="d.fail", error_type="ValueError"
    )
    assert dash.status(dash.tasks["failed"]) == "purged"

    bad = http.post("/actions/schedule-trigger", {"schedule": "nope", "csrf": csrf})
    assert bad.status == 303 and "Not done: schedule: no schedule" in http.flash(bad)
    missing = http.post("/actions/task-cancel", {"csrf": csrf, "next": "/schedules"})
    assert missing.headers["location"] == "/schedules"
    assert "form field 'id' is missing" in http.flash(missing)


def test_read_only_has_no_action_endpoint(make_dash: object) -> None:
    dash = make_dash(actions=False)  # type: ignore[operator]
    http = dash.http()
    page = http.get("/")
    assert page.status == 200 and "/actions/" not in page.text
    assert http.get("/bulk?op=cancel&queue=work").status == 404
    assert 'type="checkbox"' not in http.get("/tasks").text
    csrf = page.csrf()  # the logout form still carries one
    for name in ("task-retry", "queue-pause", "schedule-trigger", "failed-discard"):
        reply = http.post(f"/actions/{name}", {"csrf": csrf, "queue": "a", "id": "x"})
        assert reply.status == 404


def test_without_a_token_only_loopback_names_are_served(make_dash: object) -> None:
    dash = make_dash(token_file=None, actions=False)  # type: ignore[operator]
    http = Http(dash.port)
    assert http.get("/").status == 200
    assert "read-only" in http.get("/").text
    rebound = http.get("/", headers={"Host": "attacker.example:80"})
    assert rebound.status == 421
    assert http.get("/", headers={"Host": f"localhost:{dash.port}"}).status == 200
    assert http.post("/actions/task-retry", {"id": "x"}).status == 404


def test_overview_reads_once_per_interval_however_many_browsers(make_dash: object) -> None:
    dash = make_dash(refresh="30s")  # type: ignore[operator]
    cookie = dash.http().cookie

    def browse(n: int) -> int:
        reply = Http(dash.port, cookie=cookie).get(("/", "/failed", "/schedules")[n % 3])
        assert reply.status == 200
        return _snapshot(reply.text)

    # 64 page views from 8 browsers at once, the first ones racing for a cold snapshot:
    # they all share the one read.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert set(pool.map(browse, range(64))) == {1}


def test_overview_is_read_again_after_the_interval(make_dash: object) -> None:
    dash = make_dash(refresh="250ms")  # type: ignore[operator]
    http = dash.http()
    first = _snapshot(http.get("/").text)
    wait_for("a newer snapshot", lambda: _snapshot(http.get("/").text) > first)


def _snapshot(text: str) -> int:
    found = re.search(r'data-snapshot="(\d+)"', text)
    assert found, text[:1000]
    return int(found.group(1))


def test_check_refuses_non_loopback_without_token(tmp_path: Path) -> None:
    base = tmp_path
    config = dashboard_config(base, "sqlite", str(base / "t.db"))
    config["dashboard"] = {"listen": "0.0.0.0:8470"}
    path = write_config(base, config)
    done = cli(path, "check")
    assert done.returncode == 78, done.stderr
    assert "dashboard.listen: serves the dashboard beyond this host on 0.0.0.0:8470" in done.stderr
    config["dashboard"] = {"listen": "127.0.0.1:8470", "actions": True}
    done = cli(write_config(base, config), "check")
    assert done.returncode == 78
    assert "dashboard.actions: needs dashboard.token_file" in done.stderr


def test_a_taken_port_stops_the_daemon(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        config = dashboard_config(tmp_path, "sqlite", str(tmp_path / "t.db"))
        config["dashboard"]["listen"] = f"127.0.0.1:{taken.getsockname()[1]}"
        daemon = Daemon(tmp_path, config)
        daemon.start(wait_ready=False)
        assert daemon.proc is not None
        assert daemon.proc.wait(60) == 78
        assert "the address is already in use; set dashboard.listen at" in daemon.output()
        daemon.stop()
    finally:
        taken.close()


def test_workers_of_every_reporting_daemon(dash: Dash, tmp_path: Path) -> None:
    """A second daemon on the same database, serving no dashboard but reporting: the
    first one's Workers page shows its children beside its own."""
    folder = tmp_path / "second"
    folder.mkdir()
    config = dashboard_config(folder, dash.dialect, dash.target)
    config["dashboard"] = {"report": True}
    config["groups"] = {"other": {"queues": ["elsewhere"], "processes": 2}}
    del config["schedules"]
    second = Daemon(folder, config)
    try:
        second.start()
        pids = wait_for("the second daemon's children", lambda: second.children("other"))
        http = dash.http()

        def shown() -> bool:
            page = http.get("/workers").text
            return all(f'<td class="num">{pid}</td>' in page for pid in pids)

        wait_for("the second daemon's children on the Workers page", shown, 60)
        page = http.get("/workers").text
        assert f"pid {second.pid}, reported" in page
        assert f"pid {dash.daemon.pid}, this host, live" in page
        # The fleet lists both daemons, from the registry, with their versions.
        fleet = page[page.index("<h2>Fleet</h2>") : page.index("</section>")]
        for daemon in (second, dash.daemon):
            assert f"/{daemon.pid}</small></td><td>{__version__}</td>" in fleet
        assert "Mixed versions" not in fleet
        (own,) = dash.daemon.children("w")
        assert f'<td class="num">{own}</td>' in page
        assert '<th scope="row">other</th>' in http.get("/").text
        assert "dashboard on http" not in second.output()  # it serves nothing
    finally:
        second.stop()
