"""What `tracing.enabled` needs installed, read from the same `OTEL_*` variables the
OpenTelemetry SDK reads: the SDK itself, and an exporter for each name in
`OTEL_TRACES_EXPORTER` (the SDK finds exporters by entry point, as here). The config
check and the worker child's setup (cairnqd/daemon/otelsetup.py) share it, so
`cairnqd check` refuses exactly what a child could not start.

`otlp` names no exporter by itself: as in the SDK's auto-configuration, it is the gRPC
exporter, or the one `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` (else
`OTEL_EXPORTER_OTLP_PROTOCOL`) names: `grpc` or `http/protobuf`."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

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


#: The exporter each OTLP protocol names (the SDK's table), and the variables naming the
#: protocol for traces, the first set winning.
OTLP_BY_PROTOCOL = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


class ProtocolError(ValueError):
    """An OTLP protocol variable names no protocol an exporter speaks."""


def exporter_names(env: Mapping[str, str]) -> list[str]:
    """`OTEL_TRACES_EXPORTER` as a list (the SDK's default: otlp); `none` exports nothing."""
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip() or "otlp"
    names = [n.strip() for n in raw.split(",") if n.strip()]
    return [] if names == ["none"] else names


def otlp_protocol(env: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, protocol) of the first protocol variable set, or None."""
    for variable in PROTOCOL_VARIABLES:
        value = env.get(variable, "").strip()
        if value:
            return variable, value
    return None


def entry_point_name(name: str, env: Mapping[str, str]) -> str:
    """The entry point the SDK loads for `name`: `otlp` by its protocol, others as they
    are. Raises ProtocolError for a protocol no exporter speaks."""
    if name != "otlp":
        return name
    chosen = otlp_protocol(env)
    if chosen is None:
        return OTLP_BY_PROTOCOL["grpc"]
    variable, protocol = chosen
    try:
        return OTLP_BY_PROTOCOL[protocol]
    except KeyError:
        known = " or ".join(OTLP_BY_PROTOCOL)
        raise ProtocolError(
            f"{variable}={protocol} is not a protocol the OTLP exporters speak: use {known}"
        ) from None


def exporter_entry_point(name: str, env: Mapping[str, str]) -> EntryPoint | None:
    """The installed exporter `name` (in `OTEL_TRACES_EXPORTER`) stands for, or None."""
    # Imported here: importlib.metadata is a sixth of a daemon child's start-up, and
    # only a child that traces looks an exporter up.
    from importlib.metadata import entry_points

    found = entry_points(group=EXPORTER_GROUP, name=entry_point_name(name, env))
    return next(iter(found), None)


def missing(env: Mapping[str, str]) -> list[str]:
    """What is missing for tracing, one sentence each ([] when all is there)."""
    if importlib.util.find_spec("opentelemetry") is None or (
        importlib.util.find_spec("opentelemetry.sdk") is None
    ):
        return ["needs the OpenTelemetry SDK: pip install opentelemetry-sdk"]
    problems = []
    for name in exporter_names(env):
        try:
            entry = exporter_entry_point(name, env)
        except ProtocolError as exc:
            problems.append(f"OTEL_TRACES_EXPORTER={name}: {exc}")
            continue
        if entry is None:
            problems.append(
                f"OTEL_TRACES_EXPORTER={name}{_over(name, env)} has no exporter "
                f"installed: {_fix(name, env)}"
            )
    return problems


def _over(name: str, env: Mapping[str, str]) -> str:
    """For `otlp` over a protocol the environment chose: which, as the variable says."""
    chosen = otlp_protocol(env) if name == "otlp" else None
    return "" if chosen is None else f" ({chosen[0]}={chosen[1]})"


def _fix(name: str, env: Mapping[str, str]) -> str:
    # Plain `otlp` (gRPC) is what the opentelemetry-exporter-otlp bundle installs.
    chosen = otlp_protocol(env) if name == "otlp" else None
    package = _PROVIDERS.get(name if chosen is None else entry_point_name(name, env))
    return f"pip install {package}" if package else "no installed package provides it"


__all__ = [
    "EXPORTER_GROUP",
    "OTLP_BY_PROTOCOL",
    "ProtocolError",
    "entry_point_name",
    "exporter_entry_point",
    "exporter_names",
    "missing",
    "otlp_protocol",
]
