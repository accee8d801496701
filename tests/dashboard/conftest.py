"""Fixtures for the dashboard: a real daemon serving it, a database holding tasks in
every status, and an HTTP client that keeps a session cookie."""

from __future__ import annotations

import concurrent.futures
import html
import http.client
import re
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from cairnqd import CairnQ
from tests.support.daemon import Daemon, base_config
from tests.support.databases import PgDatabases, require_postgres
from tests.support.harness import client_call, database_section
from tests.support.waiting import wait_for

TOKEN = "dashboard-test-token-0123456789"
#: The viewers' token: a login that sees every page and may do nothing.
VIEWER_TOKEN = "dashboard-viewer-token-98765432"
#: The search box looks through this many of the newest tasks in these tests.
SEARCH_SCAN = 6
#: Payloads and names that would run script if any page pasted them as HTML.
XSS_PAYLOAD = {
    "html": '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">',
    "attr": '" onmouseover="window.__xss = 3',
}
XSS_NAME = "<script>window.__xss=4</script>"
XSS_QUEUE = "q<b>x"
SCRIPT_RAW = "<script>window.__xss"


def run(dialect: str, target: str, work: Callable[[CairnQ], Awaitable[Any]]) -> Any:
    # A thread of its own: Playwright's sync API keeps an event loop on the test's thread.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(client_call, dialect, target, work).result()


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    text: str

    def csrf(self) -> str:
        found = re.search(r'name="csrf" value="([0-9a-f]{64})"', self.text)
        assert found, f"no CSRF value in the page:\n{self.text[:2000]}"
        return found.group(1)


@dataclass
class Http:
    """A tiny HTTP client: no redirects followed, its cookies kept (`cookie` is the
    Cookie header it sends)."""

    port: int
    cookie: str | None = None
    host: str = "127.0.0.1"

    def request(
        self,
        method: str,
        path: str,
        form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> Reply:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        sent = dict(headers or {})
        if self.cookie and "Cookie" not in sent:
            sent["Cookie"] = self.cookie
        if form is not None:
            body = urlencode(form).encode()
            sent.setdefault("Content-Type", "application/x-www-form-urlencoded")
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            text = response.read().decode("utf-8", errors="replace")
            pairs = response.getheaders()
        finally:
            conn.close()
        got = {k.lower(): v for k, v in pairs}
        jar = dict(c.split("=", 1) for c in (self.cookie or "").split("; ") if "=" in c)
        for name, value in pairs:
            if name.lower() == "set-cookie":
                key, _, kept = value.split(";", 1)[0].partition("=")
                if kept:
                    jar[key] = kept
                else:
                    jar.pop(key, None)
        self.cookie = "; ".join(f"{k}={v}" for k, v in jar.items()) or None
        return Reply(response.status, got, text)

    def follow(self, reply: Reply) -> Reply:
        """The page a 303 sends the browser to."""
        assert reply.status == 303, (reply.status, reply.text[:500])
        return self.get(reply.headers["location"])

    def flash(self, reply: Reply) -> str:
        """The flash message of the page a 303 leads to (its text, unescaped)."""
        page = self.follow(reply)
        found = re.search(r'<div id="flash" class="flash (ok|error)"[^>]*>(.*?)</div>', page.text)
        assert found, f"no flash message on {reply.headers['location']}:\n{page.text[:1500]}"
        return html.unescape(found.group(2))

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, form: dict[str, str], **kw: Any) -> Reply:
        return self.request("POST", path, form=form, **kw)

    def login(self, token: str = TOKEN, who: str = "tester") -> Reply:
        """Log in with `token` (the operators' by default)."""
        reply = self.post("/login", {"who": who, "token": token, "next": "/"})
        assert reply.status == 303, reply.text[:500]
        return reply


@dataclass
class Dash:
    """A daemon serving the dashboard over a database with a task in every status."""

    daemon: Daemon
    port: int
    dialect: str
    target: str
    tmp: Path
    tasks: dict[str, str] = field(default_factory=dict)
    release: Path | None = None

    def http(self, *, login: bool = True) -> Http:
        client = Http(self.port)
        if login:
            client.login()
        return client

    def run(self, work: Callable[[CairnQ], Awaitable[Any]]) -> Any:
        return run(self.dialect, self.target, work)

    def status(self, task_id: str) -> str:
        async def read(q: CairnQ) -> str:
            task = await q.get(task_id)
            return "purged" if task is None else task.status

        return str(self.run(read))

    def wait_status(self, task_id: str, status: str, timeout: float = 60) -> None:
        wait_for(f"{task_id} {status}", lambda: self.status(task_id) == status, timeout)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def dashboard_port(daemon: Daemon) -> int:
    def port() -> int | None:
        for line in daemon.output().splitlines():
            if "dashboard on http://" in line:
                return int(line.rsplit(":", 1)[1].split("/")[0])
        return None

    return wait_for("the dashboard's port in the log", port, 60)


def dashboard_config(tmp: Path, dialect: str, target: str, **dashboard: Any) -> dict[str, Any]:
    token = tmp / "dashboard.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    viewer = tmp / "viewer.token"
    viewer.write_text(VIEWER_TOKEN + "\n")
    viewer.chmod(0o600)
    config = base_config(
        tmp,
        database_section(dialect, target),
        {"w": {"queues": ["work"], "processes": 1, "concurrency": 4}},
    )
    config["handlers"] = ["tests.dashboard.handlers:registry"]
    config["dashboard"] = {
        "listen": "127.0.0.1:0",
        "token_file": str(token),
        "actions": True,
        "refresh": "250ms",
        "viewer_token_file": str(viewer),
        "search_scan": SEARCH_SCAN,
        **dashboard,
    }
    if config["dashboard"]["token_file"] is None:
        del config["dashboard"]["viewer_token_file"]  # a viewer logs in beside a token
    config["schedules"] = {"nightly": {"name": "d.echo", "queue": "work", "cron": "0 3 * * *"}}
    return config


def seed(dash: Dash) -> None:
    """One task in every status (and user data that would be script if unescaped)."""
    release = dash.tmp / f"release-{uuid.uuid4().hex[:6]}"
    dash.release = release

    async def submit(q: CairnQ) -> dict[str, str]:
        ok = await q.submit("d.echo", XSS_PAYLOAD, queue="work")
        bad = await q.submit("d.fail", {"message": "<i>boom</i>"}, queue="work", max_attempts=1)
        busy = await q.submit(
            "d.block", {"until": str(release), "message": "halfway <b>"}, queue="work"
        )
        waiting = await q.submit(XSS_NAME, XSS_PAYLOAD, queue=XSS_QUEUE, key="key-<1>")
        gone = await q.submit("d.echo", {"n": 1}, queue="parked")
        await q.cancel(gone.id)
        return {
            "succeeded": ok.id,
            "failed": bad.id,
            "running": busy.id,
            "queued": waiting.id,
            "canceled": gone.id,
        }

    dash.tasks = dash.run(submit)
    for status, task_id in dash.tasks.items():
        dash.wait_status(task_id, status)


@pytest.fixture(params=["sqlite", "postgres"])
def dash(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Dash]:
    """A seeded dashboard on SQLite and on Postgres."""
    yield from _dash(request.param, tmp_path)


@pytest.fixture
def sqlite_dash(tmp_path: Path) -> Iterator[Dash]:
    """A seeded dashboard on SQLite only (the browser tests)."""
    yield from _dash("sqlite", tmp_path)


def _dash(dialect: str, tmp_path: Path, **dashboard: Any) -> Iterator[Dash]:
    pg: PgDatabases | None = None
    if dialect == "postgres":
        require_postgres()
        pg = PgDatabases()
        target = pg.new()
    else:
        target = str(tmp_path / "tasks.db")
    daemon = Daemon(tmp_path, dashboard_config(tmp_path, dialect, target, **dashboard))
    dash: Dash | None = None
    try:
        daemon.start()
        dash = Dash(daemon, dashboard_port(daemon), dialect, target, tmp_path)
        seed(dash)
        yield dash
    finally:
        if dash is not None and dash.release is not None:
            dash.release.touch()  # the running task ends, so the drain is quick
        daemon.stop()
        if pg is not None:
            pg.drop_all()


@pytest.fixture
def make_dash(tmp_path: Path) -> Iterator[Callable[..., Dash]]:
    """An unseeded SQLite dashboard with the dashboard settings given."""
    started: list[Daemon] = []

    def make(**dashboard: Any) -> Dash:
        target = str(tmp_path / "tasks.db")
        daemon = Daemon(tmp_path, dashboard_config(tmp_path, "sqlite", target, **dashboard))
        started.append(daemon)
        daemon.start()
        return Dash(daemon, dashboard_port(daemon), "sqlite", target, tmp_path)

    yield make
    for daemon in started:
        daemon.stop()
