"""OpenTelemetry traces of tasks, when the application traces.

A submit inside an active span records a `create <queue>` span (kind PRODUCER) and
stores its W3C trace context in the task's metadata (`traceparent`, `tracestate`), so a
worker in any language can continue the trace; a worker runs each attempt inside a
`process <queue>` span (kind CONSUMER) whose parent and link are that context. Names
and attributes follow OpenTelemetry's messaging conventions (docs/observability.md,
"Traces").

The rule this module keeps: it imports nothing of OpenTelemetry until it is in use.
A submit looks for `opentelemetry.trace` among the loaded modules (an application that
traces has imported it) and for an active span; a worker decides once, when it starts,
whether a tracer provider is set, so a worker without one pays one attribute test per
task and nothing else.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cairnqd.context import TaskContext
    from cairnqd.models import Task

__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "Consumer",
    "consumer",
    "end",
    "provider_set",
    "record_failure",
    "traced_submit",
    "traced_submit_many",
]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
SYSTEM = "cairnq"
#: The instrumentation scope spans are recorded under.
SCOPE = "cairnqd"

#: Outcomes (as `InFlight.release` reports them) that end a process span in error;
#: "interrupted": a daemon child's QUIT stopped the attempt (cairnqd/daemon/child/main.py).
_ERROR_OUTCOMES = frozenset({"failed", "retried", "lease_lost", "interrupted"})

#: (provider, tracer): `get_tracer` builds a new tracer on every call.
_tracer_cache: tuple[object, Any] | None = None


def _api() -> ModuleType | None:
    """`opentelemetry.trace` when something in this process imported it."""
    return sys.modules.get("opentelemetry.trace")


def provider_set() -> bool:
    """Whether a real tracer provider is set (the API's default records nothing)."""
    trace = _api()
    if trace is None:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _tracer(trace: ModuleType) -> Any:
    global _tracer_cache
    provider = trace.get_tracer_provider()
    cached = _tracer_cache
    if cached is not None and cached[0] is provider:
        return cached[1]
    tracer = trace.get_tracer(SCOPE, _version())
    _tracer_cache = (provider, tracer)
    return tracer


def _version() -> str | None:
    try:
        import cairnqd

        return str(cairnqd.__version__)
    except Exception:  # an uninstalled tree: the scope simply has no version
        return None


def _propagator() -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def _common(queue: str, name: str, operation: str) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
        "messaging.destination.name": queue,
        "cairnq.task.name": name,
    }


# -- producing ----------------------------------------------------------------------------


def _active(trace: ModuleType | None) -> bool:
    return trace is not None and bool(trace.get_current_span().get_span_context().is_valid)


async def traced_submit(submit: Callable[..., Awaitable[Task]], /, **arguments: Any) -> Task:
    """`submit(**arguments)`, inside a create span when a span is active."""
    trace = _api()
    if trace is None or not _active(trace):
        return await submit(**arguments)
    queue = arguments.get("queue", "default")
    span = _start_create(trace, queue, str(arguments["name"]))
    arguments["metadata"] = _carry(trace, span, arguments.get("metadata"))
    with trace.use_span(span, end_on_exit=True):
        task = await submit(**arguments)
        span.set_attribute("messaging.message.id", task.id)
    return task


async def traced_submit_many(
    submit_many: Callable[..., Awaitable[list[Task]]],
    tasks: Sequence[Mapping[str, Any]],
    /,
    **arguments: Any,
) -> list[Task]:
    """`submit_many(tasks, **arguments)`, with a create span per item when a span is
    active. A bad item is left for the store to report, by its index."""
    trace = _api()
    if trace is None or not tasks or not _active(trace):
        return await submit_many(tasks, **arguments)
    spans: list[Any] = []
    items: list[Any] = []
    for item in tasks:
        if not isinstance(item, Mapping):
            items.append(item)
            continue
        span = _start_create(trace, str(item.get("queue", "default")), _label(item.get("name")))
        spans.append(span)
        items.append({**item, "metadata": _carry(trace, span, item.get("metadata"))})
    try:
        submitted = await submit_many(items, **arguments)
    except BaseException as exc:
        for span in spans:
            _fail(trace, span, exc)
            span.end()
        raise
    for span, task in zip(spans, submitted, strict=False):
        span.set_attribute("messaging.message.id", task.id)
        span.end()
    return submitted


def _label(name: Any) -> str:
    if isinstance(name, str):
        return name
    return str(getattr(name, "name", name))


def _start_create(trace: ModuleType, queue: str, name: str) -> Any:
    return _tracer(trace).start_span(
        f"create {queue}",
        kind=trace.SpanKind.PRODUCER,
        attributes=_common(queue, name, "create"),
    )


def _carry(trace: ModuleType, span: Any, metadata: Any) -> Any:
    """`metadata` with the span's context added: a new dict, never the caller's. A
    `traceparent` the caller set stays; metadata that is not an object cannot carry one."""
    if metadata is None:
        carrier: dict[str, Any] = {}
    elif isinstance(metadata, Mapping) and TRACEPARENT not in metadata:
        carrier = dict(metadata)
    else:
        return metadata
    _propagator().inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def _fail(trace: ModuleType, span: Any, exc: BaseException) -> None:
    if span.is_recording():
        span.record_exception(exc)
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


# -- consuming ----------------------------------------------------------------------------


class Consumer:
    """A worker's process spans. Built by `consumer()` when a provider is set."""

    def __init__(self, trace: ModuleType) -> None:
        from opentelemetry import context

        self._trace = trace
        self._context = context
        self._tracer = _tracer(trace)
        self._propagator = _propagator()

    def start(self, contexts: Sequence[TaskContext]) -> Any:
        """Start a process span for each task of a call (kept on its context, ended by
        `end`); for a call of one task the span becomes current. Returns what `leave`
        needs to make it current no longer."""
        for ctx in contexts:
            ctx.trace_span = self._start(ctx)
        if len(contexts) != 1:
            return None
        current = self._trace.set_span_in_context(contexts[0].trace_span)
        return self._context.attach(current)

    def leave(self, token: Any) -> None:
        if token is not None:
            self._context.detach(token)

    def _start(self, ctx: TaskContext) -> Any:
        trace = self._trace
        task = ctx.task
        parent = self._creation(task.metadata)
        attributes = _common(task.queue, task.name, "process")
        attributes["messaging.message.id"] = task.id
        attributes["cairnq.task.attempt"] = task.attempt
        attributes["messaging.client.id"] = ctx.worker_id
        if parent is None:
            # A task submitted outside a trace starts its own, whatever span the
            # worker's own code may have open.
            return self._tracer.start_span(
                f"process {task.queue}",
                context=self._context.Context(),
                kind=trace.SpanKind.CONSUMER,
                attributes=attributes,
            )
        creation = trace.get_current_span(parent).get_span_context()
        return self._tracer.start_span(
            f"process {task.queue}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes=attributes,
            links=[trace.Link(creation)],
        )

    def _creation(self, metadata: Any) -> Any:
        """The creation context a task's metadata carries, or None."""
        if not isinstance(metadata, dict):
            return None
        traceparent = metadata.get(TRACEPARENT)
        if not isinstance(traceparent, str):
            return None
        carrier = {TRACEPARENT: traceparent}
        tracestate = metadata.get(TRACESTATE)
        if isinstance(tracestate, str):
            carrier[TRACESTATE] = tracestate
        parent = self._propagator.extract(carrier, context=self._context.Context())
        if not self._trace.get_current_span(parent).get_span_context().is_valid:
            return None  # malformed: the task starts a trace of its own
        return parent


def consumer() -> Consumer | None:
    """A worker's process spans, or None (and nothing recorded) without a provider."""
    if not provider_set():
        return None
    trace = _api()
    assert trace is not None  # provider_set() found it
    return Consumer(trace)


def record_failure(ctx: TaskContext, exc: BaseException) -> None:
    """The handler of `ctx` raised `exc`: record it on the process span."""
    span = ctx.trace_span
    if span is not None:
        trace = _api()
        if trace is not None:
            _fail(trace, span, exc)


def end(ctx: TaskContext, outcome: str, reason: str) -> None:
    """End `ctx`'s process span with the attempt's outcome (`InFlight.release`)."""
    span = ctx.trace_span
    ctx.trace_span = None
    trace = _api()
    if trace is None:
        return
    span.set_attribute("cairnq.task.outcome", outcome)
    if outcome in _ERROR_OUTCOMES and span.is_recording():
        # A raised exception already set the status with its own description.
        status = getattr(span, "status", None)
        if status is None or status.status_code is not trace.StatusCode.ERROR:
            span.set_status(trace.Status(trace.StatusCode.ERROR, reason or outcome))
    span.end()
