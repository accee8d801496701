"""The dashboard in a real browser: Debian's chromium, driven by Playwright.

Needs `chromium` (/usr/bin/chromium; .ci/run installs it) and the `playwright` package
(the [test] extra); the browser Playwright would download is never used. With
CAIRNQD_DASHBOARD_SCREENSHOTS=1 the first test rewrites docs/dashboard/*.png.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cairnqd import CairnQ
from cairnqd.queue_counts import WAIT, QueueTally, rows_of
from tests.dashboard.conftest import TOKEN, VIEWER_TOKEN, Dash
from tests.support.waiting import wait_for

playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "dashboard"
SCREENSHOTS = os.environ.get("CAIRNQD_DASHBOARD_SCREENSHOTS") == "1"
#: Runs before any page script: records CSP violations and console errors.
WATCH = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__violations.push(e.violatedDirective + " " + e.blockedURI);
});
"""


@pytest.fixture
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM) or shutil.which("chromium") is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    with playwright_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


class Tab:
    """One logged-in page, with the console errors it saw."""

    def __init__(self, browser: Any, dash: Dash, **context: Any) -> None:
        self.dash = dash
        self.context = browser.new_context(
            **{"viewport": {"width": 1280, "height": 800}, **context}
        )
        self.context.add_init_script(WATCH)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("dialog", lambda d: d.accept())

    def go(self, path: str) -> Any:
        response = self.page.goto(self.dash.url + path)
        assert response is not None
        return response

    def login(self, token: str = TOKEN) -> None:
        self.go("/")
        assert "/login" in self.page.url
        self.page.fill("input[name=who]", "browser")
        self.page.fill("input[name=token]", token)
        self.page.click("form.login button[type=submit]")
        self.page.wait_for_url(self.dash.url + "/")

    def size(self, selector: str) -> dict[str, float]:
        """The width and height of the first element `selector` finds, measured in one
        step inside the page. Playwright's `bounding_box` finds the element and then
        measures it, and a live refresh that swaps the page in between leaves it measuring
        a detached element (None)."""
        size = self.page.evaluate(
            "s => { const e = document.querySelector(s);"
            " if (!e) return null;"
            " const r = e.getBoundingClientRect();"
            " return {width: r.width, height: r.height}; }",
            selector,
        )
        assert size is not None, f"nothing on the page matches {selector}"
        return dict(size)

    def clean(self) -> None:
        """No script ran from user data, nothing broke the CSP, nothing failed."""
        assert self.page.evaluate("window.__xss") is None
        assert self.page.evaluate("window.__violations") == []
        assert (
            self.page.evaluate("document.querySelectorAll('[onmouseover],[onerror]').length") == 0
        )
        assert self.errors == []

    def shot(self, name: str, *, full_page: bool = True) -> None:
        if SCREENSHOTS:
            DOCS.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(DOCS / f"{name}.png"), full_page=full_page)


def _busier(dash: Dash) -> None:
    """Some history for the screenshots: tasks finished, failures of two kinds, a
    delay, and a day of per-queue counts as workers would have added them."""

    async def submit(q: CairnQ) -> list[str]:
        made = [await q.submit("d.echo", {"i": i}, queue="work") for i in range(240)]
        for i in range(18):
            message = ("disk full", "no invoice 1234 in billing")[i % 2]
            payload = {"message": message, "kind": ("value", "lookup")[i % 2]}
            made.append(await q.submit("d.fail", payload, queue="work", max_attempts=1))
        for i in range(3):
            await q.submit("d.echo", {"i": i}, queue="reports", delay_ms=3_600_000)
        return [t.id for t in made]

    ids = dash.run(submit)
    for task_id in ids[-1:]:
        dash.wait_status(task_id, "failed")

    async def history(q: CairnQ) -> None:
        tally = QueueTally()
        now = int(time.time() * 1000)
        for minute in range(24 * 60):
            at = now - minute * 60_000
            busy = 3 + (minute * 7919) % 11 + (8 if 540 < minute % 1440 < 1020 else 0)
            for i in range(busy):
                tally.add("work", WAIT, (i * 37) % 90, at)
                tally.add("work", "succeeded", 20 + (i * 53) % 400, at)
            if minute % 9 == 0:
                tally.add("work", "failed", 1200, at)
            tally.add("reports", "succeeded", 2500 + (minute % 5) * 300, at)
        await q.store.queue_counts.add(rows_of(tally.take()))

    dash.run(history)


def test_every_page_in_a_browser_with_user_data_inert(browser: Any, sqlite_dash: Dash) -> None:
    dash = sqlite_dash
    if SCREENSHOTS:
        _busier(dash)
    tab = Tab(browser, dash)
    tab.go("/")
    tab.shot("login")
    tab.login()
    titles = {"/": "Overview", "/tasks": "Tasks", "/charts": "Charts, last 1h",
              "/failed": "Failed", "/workers": "Workers", "/schedules": "Schedules"}  # fmt: skip
    for path, title in titles.items():
        response = tab.go(path)
        assert response.status == 200
        assert tab.page.locator("main h1").inner_text() == title
        tab.clean()
    tab.go("/")
    assert tab.page.locator(".totals").inner_text().count("\n") >= 5
    tab.shot("overview")
    for status, task_id in dash.tasks.items():
        tab.go(f"/task/{task_id}")
        assert tab.page.locator(f".status.st-{status}").first.is_visible()
        tab.clean()
    # The payload shows as text, exactly as submitted.
    tab.go(f"/task/{dash.tasks['queued']}")
    assert "<script>window.__xss = 1</script>" in tab.page.locator("pre").first.inner_text()
    assert "<script>window.__xss=4</script>" in tab.page.locator("main h1").inner_text()
    tab.go(f"/task/{dash.tasks['failed']}")
    assert "Traceback (most recent call last)" in tab.page.locator("pre.trace").inner_text()
    tab.shot("task")
    for path in ("/tasks", "/charts", "/failed", "/workers", "/schedules"):
        tab.go(path)
        tab.clean()
        tab.shot(path.strip("/"), full_page=path != "/tasks")
    # Paging by clicking: the next page has other rows.
    tab.go("/tasks?limit=2")
    first = tab.page.locator("tbody a.mono").all_inner_texts()
    tab.page.click("a[rel=next]")
    assert set(tab.page.locator("tbody a.mono").all_inner_texts()).isdisjoint(first)
    # A malformed filter is a page saying why, not an error.
    assert tab.go("/tasks?status=nope").status == 400
    assert "status: must be one of" in tab.page.inner_text("main")
    tab.errors.clear()  # the 400 itself is logged by the console


def test_live_update_without_reload(browser: Any, sqlite_dash: Dash) -> None:
    dash = sqlite_dash
    tab = Tab(browser, dash)
    tab.login()
    running = dash.tasks["running"]
    tab.go(f"/task/{running}")
    assert tab.page.locator(".status.st-running").is_visible()
    tab.page.evaluate("window.__sameDocument = true")
    assert dash.release is not None
    dash.release.touch()
    tab.page.wait_for_selector(".status.st-succeeded", timeout=60_000)
    assert tab.page.evaluate("window.__sameDocument") is True  # no reload happened
    assert "final" in tab.page.inner_text("#live-state")
    assert '"released": true' in tab.page.locator("pre").nth(1).inner_text()

    tab.go("/")
    tab.page.evaluate("window.__sameDocument = true")
    before = tab.page.locator("a.total.st-queued b").inner_text()

    async def submit(q: CairnQ) -> None:
        await q.submit("d.echo", {}, queue="parked")

    dash.run(submit)
    # Polled from here: the page's CSP forbids the eval wait_for_function would need.
    wait_for(
        "the queued total to change in place",
        lambda: tab.page.locator("a.total.st-queued b").inner_text() != before,
        60,
    )
    assert tab.page.evaluate("window.__sameDocument") is True
    tab.clean()


def test_an_opened_traceback_stays_open_while_the_page_updates(
    browser: Any, sqlite_dash: Dash
) -> None:
    dash = sqlite_dash

    async def failed_then_running(q: CairnQ) -> str:
        # Queue default: the daemon serves only "work", so this task is ours to drive.
        task = await q.submit("d.echo", {}, max_attempts=3)
        for worker in ("host1:g.0:A", "host1:g.0:B"):
            claimed = await q.store.claim(queues=["default"], worker_id=worker, lease_ms=60_000)
            assert [t.id for t in claimed] == [task.id]
            if worker.endswith("A"):
                trace = {"traceback": "Traceback: first"}
                error = {"type": "ValueError", "code": "handler_error", "message": "first",
                         "retryable": True, "details": trace}  # fmt: skip
                await q.store.fail(task_id=task.id, worker_id=worker, error=error)
        return task.id

    task_id = dash.run(failed_then_running)
    tab = Tab(browser, dash)
    tab.login()
    tab.go(f"/task/{task_id}")
    assert tab.page.locator("main#page").get_attribute("data-live")
    tab.page.click("#attempt-1-trace summary")
    assert "Traceback: first" in tab.page.locator("pre.attempt-trace").inner_text()
    swaps = tab.page.locator("main#page").get_attribute("data-updated")
    wait_for(
        "two live updates of the page",
        lambda: tab.page.locator("main#page").get_attribute("data-updated") != swaps,
        30,
    )
    swaps = tab.page.locator("main#page").get_attribute("data-updated")
    wait_for(
        "another live update",
        lambda: tab.page.locator("main#page").get_attribute("data-updated") != swaps,
        30,
    )
    assert tab.page.locator("#attempt-1-trace").evaluate("d => d.open") is True
    assert tab.page.locator("pre.attempt-trace").is_visible()
    tab.clean()


def test_actions_by_clicking_and_refused_without_csrf(browser: Any, sqlite_dash: Dash) -> None:
    dash = sqlite_dash
    tab = Tab(browser, dash)
    tab.login()
    failed = dash.tasks["failed"]
    tab.go(f"/task/{failed}")
    tab.page.click("form.act button:has-text('Retry')")
    # Back on the task's page, the flash message on top says what happened.
    assert tab.page.url == dash.url + f"/task/{failed}"
    assert "queued again" in tab.page.inner_text("#flash")
    dash.wait_status(failed, "failed")

    tab.go("/")
    row = tab.page.locator("tr", has=tab.page.locator("th a", has_text=re.compile("^parked$")))
    row.locator("input[name=reason]").fill("deploy")
    row.locator("button:has-text('Pause')").click()
    assert "queue parked paused" in tab.page.inner_text("#flash")
    assert tab.page.url == dash.url + "/"
    # The overview is served from the shared snapshot, read once per refresh: the pause
    # shows within an interval, not necessarily on the very next page.
    wait_for(
        "the overview to show the pause and its reason",
        lambda: tab.go("/").ok and "deploy" in tab.page.inner_text("main"),
        timeout=30,
    )

    tab.go("/failed")
    tab.page.click("form.act button:has-text('Retry all')")  # confirmed by the dialog handler
    assert "queued again" in tab.page.inner_text("#flash")
    tab.go("/failed")
    assert tab.page.locator("#flash").count() == 0  # shown once

    # The same request without the page's CSRF value, from this logged-in browser.
    refused = tab.page.request.post(
        dash.url + "/actions/task-retry", form={"id": failed, "next": "/"}
    )
    assert refused.status == 403
    # And with it, but from a page of another origin.
    csrf = tab.page.evaluate("document.querySelector('input[name=csrf]').value")
    cross = tab.page.request.post(
        dash.url + "/actions/task-retry",
        form={"id": failed, "csrf": csrf},
        headers={"Origin": "http://evil.example"},
    )
    assert cross.status == 403
    assert "refused" in dash.daemon.output()

    tab.page.click("header button:has-text('Log out')")
    assert "/login" in tab.page.url
    assert tab.go("/").url.startswith(dash.url + "/login")


def test_search_box_in_the_header(browser: Any, sqlite_dash: Dash) -> None:
    dash = sqlite_dash
    tab = Tab(browser, dash)
    tab.login()
    tab.go("/workers")
    # An id goes straight to its task.
    tab.page.fill("header input[name=q]", dash.tasks["failed"])
    tab.page.press("header input[name=q]", "Enter")
    tab.page.wait_for_url(dash.url + f"/task/{dash.tasks['failed']}")
    # Text lists the tasks that hold it, and stays in the box.
    tab.page.fill("header input[name=q]", "halfway")
    tab.page.click("header form.search button")
    assert tab.page.locator("main h1").inner_text() == "Search"
    assert tab.page.locator("tbody a.mono").all_inner_texts() == [dash.tasks["running"]]
    assert tab.page.input_value("header input[name=q]") == "halfway"
    tab.clean()


def test_bulk_selection_by_clicking(browser: Any, sqlite_dash: Dash) -> None:
    dash = sqlite_dash

    async def submit(q: CairnQ) -> list[str]:
        return [(await q.submit("d.echo", {"i": i}, queue="parked")).id for i in range(3)]

    ids = dash.run(submit)
    tab = Tab(browser, dash)
    tab.login()
    tab.go("/tasks?queue=parked&status=queued")
    for task_id in ids[:2]:
        tab.page.check(f"input[name=id][value='{task_id}']")
    assert tab.page.inner_text("#picked") == "2 selected"
    tab.page.click("button:has-text('Cancel selected')")  # confirmed by the dialog handler
    assert tab.page.url == dash.url + "/tasks?queue=parked&status=queued"
    assert tab.page.inner_text("#flash") == "Canceled 2 task(s) of the selected"
    assert [dash.status(t) for t in ids] == ["canceled", "canceled", "queued"]
    # Select all, then all matching the filter, with its confirmation page.
    tab.page.check("#pick-all")
    assert tab.page.locator("input[name=id]:checked").count() == 1
    tab.page.click("a:has-text('Cancel all matching')")
    assert "Cancel all 1 matching" in tab.page.inner_text("main")
    tab.page.click("button:has-text('Cancel all 1')")
    assert "Canceled 1 task(s) matching" in tab.page.inner_text("#flash")
    assert dash.status(ids[2]) == "canceled"
    tab.clean()


def _snapshot_serial(text: str) -> int:
    found = re.search(r'data-snapshot="(\d+)"', text)
    assert found, text[:1000]
    return int(found.group(1))


@pytest.mark.timing
def test_refresh_pause_and_interval_keep_a_selection(browser: Any, sqlite_dash: Dash) -> None:
    dash = sqlite_dash
    tab = Tab(browser, dash)
    tab.login()
    tab.go("/")
    tab.page.evaluate("window.__sameDocument = true")

    def swapped() -> str:
        return str(tab.page.evaluate("document.getElementById('page').dataset.updated || ''"))

    wait_for("a first live swap", lambda: swapped() != "", 30)
    # Text selected on the page: the refresh waits, and the selection stays.
    tab.page.locator(".totals").select_text()
    selected = tab.page.evaluate("window.getSelection().toString()")
    assert "queued" in selected
    wait_for(
        "the footer to say it waits for the selection",
        lambda: "text is selected" in tab.page.inner_text("#live-state"),
        30,
    )
    held = swapped()
    assert tab.page.evaluate("window.getSelection().toString()") == selected
    assert swapped() == held
    # Paused by the button: no swap, even with nothing selected.
    tab.page.click("#live-pause")
    assert tab.page.inner_text("#live-pause") == "Resume"
    assert "paused" in tab.page.inner_text("#live-state")
    tab.page.evaluate("window.getSelection().removeAllRanges()")
    paused_at = swapped()

    async def submit(q: CairnQ) -> None:
        await q.submit("d.echo", {}, queue="parked")

    dash.run(submit)
    # Let the server read its snapshot four times more (each read at least one refresh
    # interval after the last): the paused page would have swapped several times.
    http = dash.http()
    first = _snapshot_serial(http.get("/").text)
    wait_for("four more snapshots", lambda: _snapshot_serial(http.get("/").text) >= first + 4)
    assert swapped() == paused_at
    tab.page.click("#live-pause")
    wait_for("a swap after resuming", lambda: swapped() != paused_at, 30)
    # The interval chosen is kept by this browser.
    tab.page.select_option("#live-every", "5000")
    tab.go("/failed")
    assert tab.page.input_value("#live-every") == "5000"
    assert tab.page.evaluate("window.__sameDocument") is None  # a new page was loaded
    tab.clean()


def test_an_answer_on_its_way_takes_neither_typed_text_nor_a_click(
    browser: Any, sqlite_dash: Dash
) -> None:
    """A live answer that arrives while a field is being filled in, or while a mouse
    button is held on a link, waits: swapping the page then would empty the field (the
    form posts without what was typed) or drop the click (pressed on one element,
    released on its replacement)."""
    dash = sqlite_dash
    tab = Tab(browser, dash)
    tab.login()
    tab.go("/")
    held: list[Any] = []

    def hold_live(route: Any) -> None:
        if route.request.headers.get("x-requested-with") == "cairnqd-live":
            held.append(route)
        else:
            route.continue_()

    tab.page.route("**/*", hold_live)

    def swapped() -> str:
        return str(tab.page.evaluate("document.getElementById('page').dataset.updated || ''"))

    def answer_the_held_one() -> None:
        """Let the held live answer through and wait until the page has dealt with it:
        swapped itself, or said it waits."""
        before = swapped()
        held.pop().continue_()
        wait_for(
            "the live answer dealt with",
            lambda: swapped() != before or "waiting" in tab.page.inner_text("#live-state"),
            30,
        )

    row = tab.page.locator("tr", has=tab.page.locator("th a", has_text=re.compile("^parked$")))
    # Typing while an answer is on its way.
    wait_for("a live request held", lambda: tab.page.evaluate("1") and held, 30)
    row.locator("input[name=reason]").fill("deploy")
    answer_the_held_one()
    assert row.locator("input[name=reason]").input_value() == "deploy"
    row.locator("input[name=reason]").fill("")
    tab.page.evaluate("document.activeElement.blur()")

    # A link pressed while an answer is on its way, released after it arrived.
    wait_for("another live request held", lambda: tab.page.evaluate("1") and held, 30)
    link = row.locator("th a")
    href = link.get_attribute("href")
    box = link.bounding_box()
    assert box is not None
    tab.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    tab.page.mouse.down()
    answer_the_held_one()
    tab.page.mouse.up()
    tab.page.wait_for_url(f"{dash.url}{href}", timeout=10_000)
    tab.page.unroute("**/*")
    for route in held:
        route.continue_()
    tab.clean()


def test_dark_mode_follows_the_system(browser: Any, sqlite_dash: Dash) -> None:
    dash = sqlite_dash
    colors = {}
    for scheme in ("light", "dark"):
        tab = Tab(browser, dash, color_scheme=scheme)
        tab.login()
        tab.go("/tasks")
        colors[scheme] = tab.page.evaluate(
            "[getComputedStyle(document.body).backgroundColor,"
            " getComputedStyle(document.querySelector('table.grid')).backgroundColor]"
        )
        if scheme == "dark":
            tab.shot("dark", full_page=False)
        tab.clean()
        tab.context.close()
    assert colors["light"][0] == "rgb(246, 247, 249)"
    assert colors["dark"][0] == "rgb(18, 22, 29)"
    assert colors["dark"][1] != colors["light"][1]


def test_usable_at_400_pixels(browser: Any, sqlite_dash: Dash) -> None:
    dash = sqlite_dash
    tab = Tab(browser, dash, viewport={"width": 400, "height": 800})
    tab.go("/")
    # The login page fits too (it has a viewport meta of its own).
    assert tab.page.evaluate("document.documentElement.scrollWidth") <= 400
    tab.login()
    for path in ("/", "/tasks", "/workers", f"/task/{dash.tasks['failed']}"):
        tab.go(path)
        header = tab.page.evaluate(
            "(() => { const h = document.querySelector('header');"
            " return [h.scrollWidth, h.clientWidth, h.getBoundingClientRect().right]; })()"
        )
        assert header[0] <= header[1] and header[2] <= 400, (path, header)
        assert tab.page.locator("header input[name=q]").is_visible()
        # Wide tables scroll inside themselves: the page does not scroll sideways.
        assert tab.page.evaluate("document.documentElement.scrollWidth") <= 400, path
    tab.shot("narrow", full_page=False)
    tab.clean()


def test_a_viewer_sees_no_action_in_the_browser(browser: Any, sqlite_dash: Dash) -> None:
    dash = sqlite_dash
    tab = Tab(browser, dash)
    tab.login(VIEWER_TOKEN)
    for path in ("/", "/tasks", "/failed", "/schedules", f"/task/{dash.tasks['failed']}"):
        tab.go(path)
        assert tab.page.locator("form[action^='/actions/']").count() == 0, path
    assert "(read-only)" in tab.page.inner_text("header")
    refused = tab.page.request.post(
        dash.url + "/actions/task-retry", form={"id": dash.tasks["failed"], "next": "/"}
    )
    assert refused.status == 403
    tab.clean()


def test_a_dependency_graph_renders_and_links(browser: Any, sqlite_dash: Dash) -> None:
    """A diamond's graph page: four boxes drawn, colored by state in both schemes, the
    page not wider than a 400 px screen in the dark one (the drawing scrolls in place),
    a box a link."""
    dash = sqlite_dash
    release = dash.tmp / "release-graph"

    async def diamond(q: CairnQ) -> list[str]:
        a = await q.submit("d.echo", {"step": "a"}, queue="work")
        b = await q.submit("d.block", {"until": str(release)}, queue="work", after=[a])
        c = await q.submit("d.echo", {"step": "c"}, queue="work", after=[a])
        d = await q.submit("d.echo", {"step": "d"}, queue="work", after=[b, c])
        return [a.id, b.id, c.id, d.id]

    a, b, c, d = dash.run(diamond)
    try:
        dash.wait_status(b, "running")
        dash.wait_status(c, "succeeded")
        fills = {}
        for scheme in ("light", "dark"):
            wide = 400 if scheme == "dark" else 900
            tab = Tab(browser, dash, color_scheme=scheme, viewport={"width": wide, "height": 700})
            tab.login()
            tab.go(f"/task/{d}")
            assert tab.page.locator("ul.deps.after li").count() == 2
            assert tab.page.evaluate("document.documentElement.scrollWidth") <= wide
            tab.page.click("p.graph-link a")
            tab.page.wait_for_url(f"{dash.url}/task/{d}/graph")
            boxes = tab.page.locator("svg.graph a.node")
            assert boxes.count() == 4
            assert tab.page.locator("svg.graph path.edge").count() == 4
            size = tab.size("svg.graph")
            assert size["width"] > 400 and size["height"] > 80
            # At 400 px the drawing scrolls inside its frame; the page does not scroll
            # sideways.
            assert tab.page.evaluate("document.documentElement.scrollWidth") <= wide
            fills[scheme] = tab.page.evaluate(
                "[...document.querySelectorAll('svg.graph a.node rect')]"
                ".map(r => getComputedStyle(r).fill)"
            )
            if scheme == "light":
                tab.shot("graph", full_page=False)
                # The live refresh swaps the drawing in: it is drawn again, not lost.
                swapped = functools.partial(
                    tab.page.locator("main#page").get_attribute, "data-updated"
                )
                wait_for("a live swap of the graph", swapped, 30)
                assert tab.page.locator("svg.graph a.node").count() == 4
                again = tab.size(f'svg.graph a.node[data-task="{b}"] rect')
                assert again["width"] > 100
            tab.clean()
            if scheme == "dark":
                tab.page.locator(f'svg.graph a.node[data-task="{a}"]').click()
                tab.page.wait_for_url(f"{dash.url}/task/{a}")
                tab.clean()
            tab.context.close()
        # Three states, three colors; the dark scheme has colors of its own.
        assert len(set(fills["light"])) == 3, fills
        assert fills["dark"] != fills["light"]
    finally:
        release.touch()
