"""A small OTLP/HTTP trace receiver a test runs itself: what a collector would see.

`Receiver` serves `POST /v1/traces` on 127.0.0.1 (an ephemeral port, a thread of the
test process), decodes each body as an `ExportTraceServiceRequest` (protobuf, the
`http/protobuf` protocol), answers 200 with an empty `ExportTraceServiceResponse`, and
keeps every span it was sent, flattened with its resource's and scope's attributes so a
test asserts on plain values. Anything else it is sent is answered 4xx and recorded in
`refused`, so a test can show that a wrong request was not silently taken.

`Blackhole` is a collector that never answers: connections are taken (by the kernel's
backlog) and no byte comes back, so each export waits out the exporter's own timeout.
"""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

PROTOBUF = "application/x-protobuf"


def value_of(value: AnyValue) -> Any:
    """An OTLP attribute value as the Python value it carries."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value_of(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    return getattr(value, kind)


def attributes_of(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {pair.key: value_of(pair.value) for pair in pairs}


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived, ids in the W3C hex form."""

    name: str
    kind: str  # the enum's name: "SPAN_KIND_CONSUMER", ...
    trace_id: str
    span_id: str
    parent_span_id: str | None
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope: str
    scope_version: str
    links: list[tuple[str, str]]  # (trace id, span id) of each link
    status_code: str  # "STATUS_CODE_UNSET", "STATUS_CODE_ERROR", ...
    status_message: str


def _flatten(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    found = []
    for resource_spans in request.resource_spans:
        resource = attributes_of(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(
                    ReceivedSpan(
                        name=span.name,
                        kind=Span.SpanKind.Name(span.kind),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex() or None,
                        attributes=attributes_of(span.attributes),
                        resource=resource,
                        scope=scope_spans.scope.name,
                        scope_version=scope_spans.scope.version,
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        status_code=Status.StatusCode.Name(span.status.code),
                        status_message=span.status.message,
                    )
                )
    return found


@dataclass
class _Record:
    lock: threading.Lock = field(default_factory=threading.Lock)
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    refused: list[str] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    record: _Record  # set on the subclass each Receiver builds

    def do_POST(self) -> None:
        if self.path != "/v1/traces":
            self._refuse(404, f"POST {self.path}: not /v1/traces")
            return
        kind = self.headers.get("Content-Type", "")
        if kind != PROTOBUF:
            self._refuse(415, f"POST {self.path}: Content-Type {kind!r}, not {PROTOBUF}")
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
            spans = _flatten(request)
        except Exception as exc:  # a body that is not the message: the test must know
            self._refuse(400, f"POST {self.path}: undecodable body: {exc!r}")
            return
        with self.record.lock:
            self.record.requests += 1
            self.record.spans.extend(spans)
        self._answer(200, ExportTraceServiceResponse().SerializeToString())

    def do_GET(self) -> None:
        self._refuse(405, f"GET {self.path}")

    def _refuse(self, code: int, what: str) -> None:
        with self.record.lock:
            self.record.refused.append(what)
        self._answer(code, b"")

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", PROTOBUF)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: pytest shows what a failing test needs from the assertions."""


class Receiver:
    """An OTLP/HTTP traces endpoint on 127.0.0.1, served by a thread until `close`."""

    def __init__(self) -> None:
        self._record = _Record()
        handler = type("Handler", (_Handler,), {"record": self._record})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="otlp-receiver", daemon=True
        )
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """The base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it (the exporter adds
        `/v1/traces`)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def spans(self, name: str | None = None) -> list[ReceivedSpan]:
        with self._record.lock:
            found = list(self._record.spans)
        return found if name is None else [s for s in found if s.name == name]

    @property
    def requests(self) -> int:
        with self._record.lock:
            return self._record.requests

    @property
    def refused(self) -> list[str]:
        with self._record.lock:
            return list(self._record.refused)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Blackhole:
    """An endpoint on 127.0.0.1 whose connections open and are never served."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(64)  # never accepted: the handshakes complete in the kernel

    @property
    def endpoint(self) -> str:
        host, port = self._socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> Blackhole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
