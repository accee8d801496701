"""`tracing:`: validated like every section; enabling it without the SDK's exporter is
refused at the line of `enabled`, and turning it on or off rolls every group."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from cairnqd.config import ConfigError, load_config
from cairnqd.config.otel_parts import entry_point_name, exporter_names, missing

BASE = """\
version: 1
database:
  path: ./t.db
handlers: [cairnqd.demo:registry]
groups:
  default:
    queues: [default]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cairnq.yaml"
    path.write_text(BASE + textwrap.dedent(text))
    return path


def test_tracing_is_off_by_default_and_on_with_an_installed_exporter(tmp_path: Path) -> None:
    off = load_config(write(tmp_path, ""), env={})
    assert off.tracing.enabled is False
    on = load_config(
        write(tmp_path, "tracing:\n  enabled: true\n"), env={"OTEL_TRACES_EXPORTER": "console"}
    )
    assert on.tracing.enabled is True
    # Turning it on changes every group's fingerprint (a roll); off keeps the old ones.
    assert on.fingerprints()["default"] != off.fingerprints()["default"]
    again = load_config(write(tmp_path, "tracing: {enabled: false}\n"), env={})
    assert again.fingerprints() == off.fingerprints()


def test_a_missing_exporter_is_named_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "tracing:\n  enabled: true\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={"OTEL_TRACES_EXPORTER": "console,zipkin"})
    [problem] = info.value.problems
    assert str(problem) == (
        f"{path}:9:12: tracing.enabled: OTEL_TRACES_EXPORTER=zipkin has no exporter "
        "installed: pip install opentelemetry-exporter-zipkin"
    )
    # The SDK's default exporter is otlp over gRPC, which this environment lacks (the
    # test extra brings only the http/protobuf one).
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert "OTEL_TRACES_EXPORTER=otlp has no exporter installed" in str(info.value)


def test_a_bad_value_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "tracing:\n  enabled: sometimes\n  sampler: always\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    text = str(info.value)
    assert f"{path}:9:12: tracing.enabled:" in text
    assert f"{path}:10:3: tracing.sampler: unknown key 'sampler'" in text


def test_exporter_names_follow_the_sdk() -> None:
    assert exporter_names({}) == ["otlp"]
    assert exporter_names({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert exporter_names({"OTEL_TRACES_EXPORTER": " console , otlp "}) == ["console", "otlp"]
    assert missing({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert missing({"OTEL_TRACES_EXPORTER": "nosuch"}) == [
        "OTEL_TRACES_EXPORTER=nosuch has no exporter installed: no installed package provides it"
    ]


def test_otlp_is_the_exporter_of_its_protocol_as_in_the_sdk() -> None:
    http = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    assert entry_point_name("otlp", http) == "otlp_proto_http"
    assert entry_point_name("otlp", {}) == "otlp_proto_grpc"
    # The traces' own variable wins over the general one.
    assert (
        entry_point_name("otlp", {**http, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"})
        == "otlp_proto_grpc"
    )
    # Other names are entry points as they are, whatever the protocol says.
    assert entry_point_name("otlp_proto_grpc", http) == "otlp_proto_grpc"
    assert entry_point_name("console", http) == "console"
    # The test extra installs the http/protobuf exporter: otlp over it is complete.
    assert missing(http) == []
    assert missing({**http, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}) == [
        "OTEL_TRACES_EXPORTER=otlp (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc) has no exporter "
        "installed: pip install opentelemetry-exporter-otlp-proto-grpc"
    ]
    assert missing({**http, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}) == [
        "OTEL_TRACES_EXPORTER=otlp: OTEL_EXPORTER_OTLP_PROTOCOL=http/json is not a protocol "
        "the OTLP exporters speak: use grpc or http/protobuf"
    ]


def test_check_names_a_missing_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    from cairnqd.config import otel_parts

    real = otel_parts.importlib.util.find_spec

    def without_sdk(name: str, *args: Any) -> Any:
        return None if name == "opentelemetry.sdk" else real(name, *args)

    monkeypatch.setattr(otel_parts.importlib.util, "find_spec", without_sdk)
    assert otel_parts.missing({"OTEL_TRACES_EXPORTER": "console"}) == [
        "needs the OpenTelemetry SDK: pip install opentelemetry-sdk"
    ]
