"""The dashboard's HTTP server: stdlib `ThreadingHTTPServer`, one thread per request.

Every answer carries a strict Content-Security-Policy (no inline script or style); a bad
parameter is a 400, a silent database a 503, anything else a logged 500. Without a token
it answers only requests addressed to a loopback name (docs/dashboard.md, "Safety").
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import re
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import quote, urlsplit

from cairnqd.config import Config
from cairnqd.daemon.listening import serve_on
from cairnqd.dashboard import graphs, listing, pages
from cairnqd.dashboard.actions import ACTIONS, FIELDS, MULTI, audit
from cairnqd.dashboard.auth import (
    COOKIE,
    FLASH_COOKIE,
    FLASH_S,
    SESSION_S,
    Auth,
    Flash,
    LoginThrottle,
    Session,
)
from cairnqd.dashboard.charts import charts_page
from cairnqd.dashboard.data import RANGES, DashboardData, DatabaseError
from cairnqd.dashboard.markup import Markup
from cairnqd.dashboard.params import (
    BULK_FILTERS,
    TASK_FILTERS,
    BadRequest,
    back_path,
    bulk_filter,
    local_path,
    parse_form,
    parse_query,
    task_id,
    task_query,
)
from cairnqd.store.browse import TaskQuery
from cairnqd.store.dependencies import GRAPH_LIMIT

log = logging.getLogger("cairnqd.dashboard")

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
_SECURITY_HEADERS = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    # Not no-referrer: under it browsers send `Origin: null`, which hides where a form
    # post came from; same-origin sends nothing to other sites all the same.
    ("Referrer-Policy", "same-origin"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
)
_STATIC = {
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}
_BODY_MAX = 64 * 1024
#: What the live script sends with its re-reads: they never take a flash message,
#: which is meant for the page the browser is sent to.
_LIVE_REQUEST = "cairnqd-live"
_ULID = re.compile(r"[0-9A-Za-z]{26}")
#: A task's dependency graph: /task/ID/graph (the id checked by `task_id`).
_GRAPH_PATH = re.compile(r"/task/([^/]*)/graph")
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
_BIND_REASONS = {
    errno.EADDRINUSE: "the address is already in use",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
    errno.EADDRNOTAVAIL: "it is not an address of this host",
}


class DashboardBindError(Exception):
    """The dashboard's address cannot be bound: an operator's problem, told in one line."""


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)


def _html(status: int, page: Markup, headers: list[tuple[str, str]] | None = None) -> Response:
    return Response(status, page.encode("utf-8"), headers=headers or [])


def _error(status: int, message: str) -> Response:
    title = HTTPStatus(status).phrase
    return _html(status, pages.plain_layout(title, pages.message_page(message, "/")))


def _redirect(location: str, headers: list[tuple[str, str]] | None = None) -> Response:
    return Response(303, b"", headers=[("Location", location), *(headers or [])])


def _static(name: str) -> bytes:
    return resources.files("cairnqd.dashboard").joinpath("static", name).read_bytes()


class Dashboard:
    """The application: routes a request to a page or an action."""

    def __init__(self, config: Config, data: DashboardData) -> None:
        self.config = config
        self.data = data
        settings = config.dashboard
        self.auth = Auth(settings.token, settings.viewer_token)
        self.search_scan = settings.search_scan
        self.throttle = LoginThrottle()
        self.actions = bool(settings.actions and settings.token)
        self.refresh_ms = int(settings.refresh.total_seconds() * 1000)
        self.static = {name: _static(name) for name in _STATIC}

    # -- entry -------------------------------------------------------------------------------

    def handle(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes, address: str
    ) -> Response:
        try:
            return self._route(method, target, headers, body, address)
        except BadRequest as exc:
            return _error(400, str(exc))
        # No ValueError is a 400 here: params.py runs the store's argument checks on the
        # request, so one raised later comes from the database's rows or the dashboard
        # itself (a row another client wrote used to answer "Bad Request" to everyone).
        except DatabaseError as exc:
            log.warning("dashboard: %s", exc)
            return _error(503, str(exc))
        except Exception:
            log.exception("dashboard: %s %s failed", method, target[:200])
            return _error(500, "the dashboard failed on this request; the daemon's log says why")

    def _route(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes, address: str
    ) -> Response:
        if not self.auth.required and not _loopback_host(headers.get("host", "")):
            return _error(421, "this dashboard answers only requests addressed to localhost")
        parts = urlsplit(target)
        path, query = parts.path, parts.query
        if path.startswith("/static/"):
            name = path.removeprefix("/static/")
            if method != "GET" or name not in self.static:
                return _error(404, f"no such file: {path[:100]}")
            headers_out = [("Cache-Control", "max-age=300")]
            return Response(200, self.static[name], _STATIC[name], headers_out)
        if path == "/favicon.ico":
            return Response(204, b"", "image/x-icon", [("Cache-Control", "max-age=86400")])
        if path == "/login":
            return self._login(method, query, body, address)
        session = self.auth.session(headers.get("cookie"))
        if self.auth.required and session is None:
            if method == "GET":
                return _redirect(f"/login?next={_quote(target)}")
            return _error(403, "log in first: this dashboard needs a token")
        viewer = pages.Viewer(session, self.auth.required, self.actions, self.refresh_ms)
        if method == "POST":
            return self._post(path, headers, body, session, address)
        if method != "GET":
            return _error(405, f"{method} is not served here")
        flash = None
        if headers.get("x-requested-with") != _LIVE_REQUEST:
            flash = self.auth.flash(headers.get("cookie"))
        response = self._page(path, query, dataclasses.replace(viewer, flash=flash))
        if flash is not None and response.status == 200:
            # Shown once: the page that showed it ends it.
            response.headers.append(("Set-Cookie", _flash_cookie("", 0)))
        return response

    # -- pages -------------------------------------------------------------------------------

    def _page(self, path: str, query: str, viewer: pages.Viewer) -> Response:
        if path == "/":
            parse_query(query, frozenset())
            overview = self.data.overview()
            body = pages.overview_page(overview, viewer)
            return self._layout("Overview", path, body, viewer, live=True)
        if path == "/tasks":
            values = parse_query(query, TASK_FILTERS)
            task_filter = task_query(values)
            rows = self.data.tasks(_one_more(task_filter))
            more = len(rows) > task_filter.limit
            here = path + (f"?{query}" if query else "")
            body = listing.tasks_page(
                values, task_filter, rows[: task_filter.limit], more, viewer, here
            )
            return self._layout("Tasks", path, body, viewer, live=False)
        if path == "/search":
            return self._search(query, viewer)
        if path == "/bulk" and self.actions:  # the confirmation step of an action
            values = parse_query(query, BULK_FILTERS)
            op, where, described = bulk_filter(values)
            count = self.data.count(where)
            body = listing.bulk_page(op, values, count, described, viewer)
            return self._layout("Confirm", path, body, viewer, live=False)
        graph_of = _GRAPH_PATH.fullmatch(path)
        if graph_of is not None:
            values = parse_query(query, frozenset({"layer"}))
            tid = task_id(graph_of.group(1))
            task, graph = self.data.graph(tid)
            if task is None:
                return _error(404, f"no task {tid} (it may have been purged)")
            body = graphs.graph_page(task, graph, GRAPH_LIMIT, values.get("layer"))
            live = graphs.graph_live(graph)
            return self._layout(f"Graph of {task.name}", path, body, viewer, live=live)
        if path.startswith("/task/"):
            parse_query(query, frozenset())
            tid = task_id(path.removeprefix("/task/"))
            task, key = self.data.task(tid)
            if task is None:
                return _error(404, f"no task {tid} (it may have been purged)")
            grace = pages.cancel_grace_of(self.data.config, task.queue)
            waits, attempts = self.data.waiting_for(task), self.data.attempts(tid)
            parents, dependents, dependents_total = self.data.dependencies(tid, graphs.LISTED_MAX)
            body = pages.task_page(
                task, key, viewer, waits, attempts, cancel_grace=grace,
                parents=parents, dependents=dependents, dependents_total=dependents_total,
            )  # fmt: skip
            live = task.status in ("queued", "running")
            return self._layout(f"Task {task.name}", path, body, viewer, live=live)
        if path == "/charts":
            values = parse_query(query, frozenset({"range"}))
            span = values.get("range", "1h")
            if span not in RANGES:
                raise BadRequest(f"range: {span!r} is not one of {', '.join(RANGES)}")
            body = charts_page(self.data.charts(span))
            return self._layout(f"Charts, last {span}", path, body, viewer, live=True)
        if path == "/failed":
            parse_query(query, frozenset())
            body = pages.failed_page(self.data.overview(), viewer)
            return self._layout("Failed", path, body, viewer, live=True)
        if path == "/workers":
            parse_query(query, frozenset())
            body = pages.workers_page(self.data.overview())
            return self._layout("Workers", path, body, viewer, live=True)
        if path == "/schedules":
            parse_query(query, frozenset())
            body = pages.schedules_page(self.config, self.data.overview(), viewer)
            return self._layout("Schedules", path, body, viewer, live=True)
        return _error(404, f"no page {path[:100]}")

    def _layout(
        self,
        title: str,
        path: str,
        body: Markup,
        viewer: pages.Viewer,
        *,
        live: bool,
        search: str = "",
    ) -> Response:
        return _html(200, pages.layout(title, path, body, viewer, live=live, search=search))

    def _search(self, query: str, viewer: pages.Viewer) -> Response:
        """The header's search box: a task id goes to its page; anything else lists
        the tasks whose key or name starts with it or whose payload holds it."""
        text = parse_query(query, frozenset({"q"})).get("q", "").strip()
        if not text:
            body = listing.search_page(text, None, self.search_scan)
            return self._layout("Search", "/search", body, viewer, live=False)
        for candidate in _id_forms(text):
            task, _ = self.data.task(candidate)
            if task is not None:
                return _redirect(f"/task/{quote(candidate, safe='')}")
        result = self.data.search(text, scan=self.search_scan, limit=listing.SEARCH_SHOWN)
        body = listing.search_page(text, result, self.search_scan)
        return self._layout("Search", "/search", body, viewer, live=False, search=text)

    # -- login and actions ---------------------------------------------------------------------

    def _login(self, method: str, query: str, body: bytes, address: str) -> Response:
        if not self.auth.required:
            return _redirect("/")
        if method == "GET":
            values = parse_query(query, frozenset({"next"}))
            back = local_path(values.get("next"))
            return _html(200, pages.plain_layout("Log in", pages.login_page(back)))
        if method != "POST":
            return _error(405, f"{method} is not served here")
        form = parse_query(_form_text(body), frozenset({"who", "token", "next"}), "form field")
        back = local_path(form.get("next"))
        who = form.get("who", "").strip() or "operator"
        clean = self.auth.clean_who(who)
        if clean is None:
            page = pages.login_page(back, "your name: letters, digits, spaces and ._@+- only")
            return _html(400, pages.plain_layout("Log in", page))
        if self.throttle.blocked(address):
            log.warning("dashboard: login refused for %r from %s: too many wrong tokens",
                        clean, address)  # fmt: skip
            page = pages.login_page(back, "too many wrong tokens from here: wait a minute")
            return _html(429, pages.plain_layout("Log in", page))
        role = self.auth.role_of(form.get("token", ""))
        if role is None:
            self.throttle.failed(address)
            log.warning("dashboard: login refused for %r from %s: wrong token", clean, address)
            page = pages.login_page(back, "wrong token")
            return _html(403, pages.plain_layout("Log in", page))
        log.info("dashboard: %s logged in from %s as %s", clean, address, role)
        cookie = (
            f"{COOKIE}={self.auth.new_cookie(clean, role=role)}; Path=/; HttpOnly; "
            f"SameSite=Strict; Max-Age={SESSION_S}"
        )
        return _redirect(back, [("Set-Cookie", cookie)])

    def _post(
        self,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        session: Session | None,
        address: str,
    ) -> Response:
        if path == "/logout":
            form = parse_query(_form_text(body), frozenset({"csrf"}), "form field")
            if session is None or not self.auth.csrf_ok(session, form.get("csrf")):
                return _error(403, "log out from the dashboard's own page")
            cookie = f"{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
            return _redirect("/login", [("Set-Cookie", cookie)])
        name = path.removeprefix("/actions/")
        if not self.actions or not path.startswith("/actions/") or name not in ACTIONS:
            return _error(404, f"no page {path[:100]}")
        if session is None:
            return _error(403, "actions need a login")
        if not session.may_act:
            audit(name, session.who, address, {}, "refused: a read-only (viewer) login")
            return _error(403, "refused: this login is read-only (the viewers' token)")
        if not _same_origin(headers):
            audit(name, session.who, address, {}, "refused: cross-origin request")
            return _error(403, "refused: the request came from another site")
        fields = FIELDS[name] | {"csrf", "next"}
        form = parse_form(_form_text(body), fields, MULTI.get(name), "form field")
        if not self.auth.csrf_ok(session, form.get("csrf")):
            audit(name, session.who, address, form, "refused: missing or wrong CSRF value")
            return _error(403, "refused: the form's CSRF value is missing or stale; "
                               "reload the page and try again")  # fmt: skip
        back = back_path(form.get("next"))
        if back is None:
            if form.get("next"):
                log.warning("dashboard: action %s: not a page of this dashboard, going to / "
                            "instead: next=%r", name, form["next"][:200])  # fmt: skip
            back = "/"
        try:
            outcome = ACTIONS[name](self.config, self.data, form, session.who)
        except (BadRequest, ValueError) as exc:
            audit(name, session.who, address, form, f"refused: {exc}")
            return self._back(back, Flash(f"Not done: {exc}", ok=False))
        except DatabaseError as exc:
            audit(name, session.who, address, form, f"failed: {exc}")
            return self._back(back, Flash(f"Not done: {exc}", ok=False))
        except Exception as exc:
            audit(name, session.who, address, form, f"failed: {exc}")
            raise
        audit(name, session.who, address, form, outcome.message)
        return self._back(back, Flash(outcome.message))

    def _back(self, back: str, flash: Flash) -> Response:
        return _redirect(back, [("Set-Cookie", _flash_cookie(self.auth.flash_cookie(flash)))])


def _flash_cookie(value: str, max_age: int = FLASH_S) -> str:
    return f"{FLASH_COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}"


def _id_forms(text: str) -> list[str]:
    """The task ids `text` may name: itself, and a bare ULID with the SDKs' prefix."""
    forms = []
    if len(text) <= 255 and re.fullmatch(r"[A-Za-z0-9_:.-]+", text):
        forms.append(text)
    bare = text[5:] if text[:5].lower() == "task_" else text
    if _ULID.fullmatch(bare) and f"task_{bare.upper()}" not in forms:
        forms.append(f"task_{bare.upper()}")  # typed in lower case, or without task_
    return forms


def _one_more(query: TaskQuery) -> TaskQuery:
    """The page's query for one row more: whether a next page exists."""
    return dataclasses.replace(query, limit=query.limit + 1)


def _quote(target: str) -> str:
    return quote(target, safe="")


def _form_text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("the form is not UTF-8") from None


def _host_name(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if ":" in host else host


def _loopback_host(host: str) -> bool:
    return _host_name(host) in _LOOPBACK_NAMES


def _same_origin(headers: Mapping[str, str]) -> bool:
    """False when the browser says the request came from another origin (Sec-Fetch-Site,
    or an Origin naming another host); a client that sends neither is judged by its CSRF
    value alone. `Origin: null` (a sandboxed or privacy-stripped origin) passes only
    when Sec-Fetch-Site vouches for it."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = headers.get("origin")
    if origin == "null":
        return site is not None
    return origin is None or urlsplit(origin).netloc.lower() == headers.get("host", "").lower()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    #: A client silent this long (a request never finished, an idle keep-alive) is
    #: dropped, so slow clients cannot hold the server's threads.
    timeout = 30
    server_version = "cairnqd-dashboard"
    sys_version = ""

    def _serve(self, method: str) -> None:
        length_text = self.headers.get("Content-Length") or "0"
        if not length_text.isdigit():
            self._send(_error(400, "Content-Length is not a number"))
            return
        length = int(length_text)
        if length > _BODY_MAX:
            self._send(_error(413, f"the request body is over {_BODY_MAX} bytes"))
            self.close_connection = True
            return
        body = self.rfile.read(length) if length else b""
        if method == "POST":
            kind = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if kind != "application/x-www-form-urlencoded":
                self._send(_error(415, "send the form as application/x-www-form-urlencoded"))
                return
        headers = {k.lower(): v for k, v in self.headers.items()}
        started = time.perf_counter()
        response = self.server.app.handle(method, self.path, headers, body, self.client_address[0])
        self.server.record(self.path, time.perf_counter() - started)
        self._send(response)

    def setup(self) -> None:
        super().setup()
        # Headers and body leave in two writes: without this, Nagle's algorithm holds
        # the body back for the client's delayed ACK (40 ms a page).
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def version_string(self) -> str:
        return "cairnqd-dashboard"

    def _send(self, response: Response) -> None:
        self.send_response(response.status)
        for name, value in _SECURITY_HEADERS:
            self.send_header(name, value)
        if not any(k == "Cache-Control" for k, _ in response.headers):
            self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in response.headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("dashboard %s: " + format, self.client_address[0], *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    app: Dashboard
    #: Server time per path, the last few hundred requests (the bench reads it).
    timings: list[tuple[str, float]]
    _timings_lock: threading.Lock

    def record(self, path: str, seconds: float) -> None:
        with self._timings_lock:
            self.timings.append((path, seconds))
            del self.timings[:-500]


class DashboardServer:
    """The dashboard on a thread of its own: `start()` binds and serves, `stop()` ends it."""

    def __init__(self, config: Config, data: DashboardData) -> None:
        self.config = config
        self.data = data
        self.app = Dashboard(config, data)
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def start(self, adopted: socket.socket | None = None) -> int:
        """Bind `dashboard.listen`, or serve on `adopted`, a socket a running parent
        passed to its successor in a binary upgrade; returns the port."""
        listen = self.config.dashboard.listen
        assert listen is not None
        try:
            family = socket.getaddrinfo(
                listen.host, listen.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0][0]

            class Server(_Server):
                address_family = family

            httpd = Server((listen.host, listen.port), _Handler, bind_and_activate=False)
            serve_on(httpd, adopted)
        except OSError as exc:
            reason = _BIND_REASONS.get(exc.errno or 0, exc.strerror or str(exc))
            raise DashboardBindError(f"cannot serve the dashboard on {listen}: {reason}") from exc
        httpd.app = self.app
        httpd.timings = []
        httpd._timings_lock = threading.Lock()
        self._httpd = httpd
        self.port = int(httpd.server_address[1])
        self.data.start()
        self.data.build_indexes()
        self.data.warm_charts()
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="cairnqd-dashboard-http",
            daemon=True,
        )
        self._thread.start()
        return self.port

    @property
    def listening_socket(self) -> socket.socket | None:
        """The socket the dashboard is served on, for a successor to adopt."""
        return None if self._httpd is None else self._httpd.socket

    def timings(self) -> list[tuple[str, float]]:
        if self._httpd is None:
            return []
        with self._httpd._timings_lock:
            return list(self._httpd.timings)

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5.0)
        self.data.stop()


__all__ = ["CSP", "Dashboard", "DashboardBindError", "DashboardServer", "Response"]
