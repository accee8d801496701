"""The OpenTelemetry SDK in a worker child, when `tracing.enabled` is set.

Everything an operator tunes comes from the SDK's own `OTEL_*` variables: the service
name and resource attributes (`Resource.create`), the sampler (the `TracerProvider`
default reads `OTEL_TRACES_SAMPLER`), the batching (`BatchSpanProcessor` reads
`OTEL_BSP_*`) and the exporters (`OTEL_TRACES_EXPORTER`, found by entry point as the
SDK's own auto-configuration does, `otlp` by its protocol variables; each reads its own
endpoint variables). We add the group and slot as resource attributes, and flush before
the child exits: on drain, and on QUIT before `os._exit`, which would lose the batch
still queued.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from cairnqd.config.otel_parts import exporter_entry_point, exporter_names, missing

log = logging.getLogger("cairnqd.tracing")

__all__ = ["ChildTracing", "TracingSetupError", "start_tracing"]


class TracingSetupError(Exception):
    """The SDK or an exporter is missing, or an exporter could not be built."""


class ChildTracing:
    """The child's tracer provider, to flush before it exits."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider

    def flush(self, timeout_s: float) -> None:
        """Export what is queued, waiting at most `timeout_s`: a collector that does not
        answer must hold up neither the exit nor the child's loop, which this blocks.

        The SDK's `force_flush` is not bounded by its argument (its batch processor
        exports all that is queued, each request bounded only by the exporter's own
        timeout, 10 s by default, and retries), so the export runs on a daemon thread,
        which the exit does not wait for once `timeout_s` has passed."""
        done: list[bool] = []

        def export() -> None:
            try:
                done.append(bool(self.provider.force_flush(int(timeout_s * 1000))))
            except Exception as exc:  # the exit goes on whatever an exporter does
                log.warning("tracing: flushing spans failed: %s", exc)
                done.append(True)  # said already

        thread = threading.Thread(target=export, name="cairnqd-trace-flush", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if not done or not done[0]:
            log.warning("tracing: spans not exported within %gs of exiting", timeout_s)


def start_tracing(
    group: str, slot: int, worker_id: str, env: Mapping[str, str] | None = None
) -> ChildTracing:
    """Set the process's tracer provider from the environment."""
    env = os.environ if env is None else env
    problems = missing(env)
    if problems:
        raise TracingSetupError("tracing.enabled: " + "; ".join(problems))
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes: dict[str, Any] = {
        "cairnqd.group": group,
        "cairnqd.slot": slot + 1,
        "service.instance.id": worker_id,
    }
    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    if not named:
        attributes["service.name"] = "cairnqd"
    # No shutdown at exit: `flush` has exported what there was, and the SDK's own would
    # wait up to 30 s for the batch thread, held by an export to a collector that does
    # not answer.
    provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
    for name in exporter_names(env):
        entry = exporter_entry_point(name, env)
        assert entry is not None  # missing() found it
        try:
            exporter = entry.load()()
        except Exception as exc:
            raise TracingSetupError(
                f"tracing.enabled: OTEL_TRACES_EXPORTER={name}: cannot build the exporter: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return ChildTracing(provider)
