"""What `tracing.enabled` needs installed, read from the same `OTEL_*` variables the
OpenTelemetry SDK reads: the SDK itself, and an exporter for each name in
`OTEL_TRACES_EXPORTER` (the SDK finds exporters by entry point, as here). The config
check and the worker child's setup (cairnqd/daemon/otelsetup.py) share it, so
`cairnqd check` refuses exactly what a child could not start."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points

#: The entry point group exporters register under (the SDK's own name for it).
EXPORTER_GROUP = "opentelemetry_traces_exporter"

#: Which package provides an exporter, for the names the OpenTelemetry project ships.
_PROVIDERS = {
    "otlp": "opentelemetry-exporter-otlp",
    "otlp_proto_grpc": "opentelemetry-exporter-otlp-proto-grpc",
    "otlp_proto_http": "opentelemetry-exporter-otlp-proto-http",
    "console": "opentelemetry-sdk",
    "zipkin": "opentelemetry-exporter-zipkin",
}


def exporter_names(env: Mapping[str, str]) -> list[str]:
    """`OTEL_TRACES_EXPORTER` as a list (the SDK's default: otlp); `none` exports nothing."""
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip() or "otlp"
    names = [n.strip() for n in raw.split(",") if n.strip()]
    return [] if names == ["none"] else names


def exporter_entry_point(name: str) -> EntryPoint | None:
    found = entry_points(group=EXPORTER_GROUP, name=name)
    return next(iter(found), None)


def missing(env: Mapping[str, str]) -> list[str]:
    """What is missing for tracing, one sentence each ([] when all is there)."""
    if importlib.util.find_spec("opentelemetry") is None or (
        importlib.util.find_spec("opentelemetry.sdk") is None
    ):
        return ["needs the OpenTelemetry SDK: pip install opentelemetry-sdk"]
    problems = []
    for name in exporter_names(env):
        if exporter_entry_point(name) is None:
            package = _PROVIDERS.get(name)
            fix = f"pip install {package}" if package else "no installed package provides it"
            problems.append(f"OTEL_TRACES_EXPORTER={name} has no exporter installed: {fix}")
    return problems


__all__ = ["EXPORTER_GROUP", "exporter_entry_point", "exporter_names", "missing"]
