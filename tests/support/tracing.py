"""A real OpenTelemetry SDK for a test: a global tracer provider whose spans land in
an in-memory exporter, unset again afterwards.

The API lets a process set its provider once; the test suite runs many tests per
process, so `traced()` puts the API's globals back as they were before any was set
(what OpenTelemetry's own test utilities do), and a later test sees no provider.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def _unset_provider() -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@contextlib.contextmanager
def traced() -> Iterator[InMemorySpanExporter]:
    """Set a global provider recording into the exporter yielded, for the block."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _unset_provider()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _unset_provider()


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = named(spans, name)
    assert len(found) == 1, f"expected one {name!r} span, got {[s.name for s in spans]}"
    return found[0]


def ids(span: ReadableSpan) -> tuple[str, str]:
    """(trace id, span id) in the W3C hex form."""
    context = span.get_span_context()
    assert context is not None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def parent_id(span: ReadableSpan) -> str | None:
    return None if span.parent is None else format(span.parent.span_id, "016x")


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})
