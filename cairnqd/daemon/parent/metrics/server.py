"""The HTTP endpoint: `/metrics` from the registry and `/healthz` from the supervisor.

`/healthz` answers 200 or 503 with a JSON body either way, so a probe needs only the
status code and an operator reading it learns what is wrong."""

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
from wsgiref.types import StartResponse, WSGIEnvironment

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from cairnqd.daemon.listening import serve_on

# One logger for the whole metrics package: one name to filter on.
log = logging.getLogger("cairnqd.metrics")


#: Whether all is well, and the JSON body that says what is not.
Health = tuple[bool, Mapping[str, Any]]


class MetricsBindError(Exception):
    """The metrics address cannot be bound: in use, privileged, or not this host's.
    An operator's problem, not a bug: the daemon reports it in one line and exits 78."""


_BIND_REASONS = {
    errno.EADDRINUSE: "the address is already in use (another cairnqd, or another program)",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
    errno.EADDRNOTAVAIL: "it is not an address of this host",
}


def bind_reason(exc: OSError) -> str:
    """Why `host:port` could not be bound, in an operator's words."""
    return _BIND_REASONS.get(exc.errno or 0, exc.strerror or str(exc))


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line each."""


class HttpServer:
    """`/metrics` and `/healthz` on a daemon thread; `close()` stops and joins it."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        health: Callable[[], Health],
        adopted: socket.socket | None = None,
    ) -> None:
        """Bind `host:port`, or serve on `adopted`, a socket a running parent passed
        to its successor in a binary upgrade (`cairnqd.daemon.listening`)."""
        self._metrics_app = make_wsgi_app(registry)
        self._health = health
        try:
            server_class, address = _server_class(host, port)
            self._httpd = server_class((address, port), _QuietHandler, bind_and_activate=False)
            serve_on(self._httpd, adopted)
            self._httpd.set_app(self._app)
        except OSError as exc:  # socket.gaierror included: a host name that does not resolve
            reason = bind_reason(exc)
            raise MetricsBindError(f"cannot serve metrics on {host}:{port}: {reason}") from exc
        self.port: int = self._httpd.server_port
        # serve_forever notices shutdown() once per poll: keep close() quick.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="cairnqd-metrics-http",
            daemon=True,
        )
        self._thread.start()

    def _app(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            body: Iterable[bytes] = self._metrics_app(environ, start_response)
            return body
        if path == "/healthz":
            healthy, report = self._healthy()
            status = "200 OK" if healthy else "503 Service Unavailable"
            start_response(status, [("Content-Type", "application/json")])
            return [json.dumps(report, indent=2).encode() + b"\n"]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: try /metrics or /healthz\n"]

    def _healthy(self) -> Health:
        try:
            return self._health()
        except Exception as exc:
            log.exception("health check failed")
            return False, {"status": "unhealthy", "problems": [f"health check failed: {exc}"]}

    @property
    def socket(self) -> socket.socket:
        """The listening socket, for a successor to adopt."""
        return self._httpd.socket

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def _server_class(host: str, port: int) -> tuple[type[WSGIServer], str]:
    # wsgiref binds AF_INET unless told otherwise; pick the family of the address given.
    family, _, _, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    return Server, str(sockaddr[0])
