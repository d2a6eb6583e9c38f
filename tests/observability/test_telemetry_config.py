"""TelemetryConfig: flags, validation, and the one place that reads the OTEL_* environment variables."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

import common.telemetry as telemetry
from common.config import add_config_args, config_from_args
from common.errors import InvalidArgumentError
from common.telemetry import setup_tracing
from common.telemetry_config import OtlpTarget, TelemetryConfig, otlp_target

ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"


@pytest.mark.parametrize(
    ("config", "environ", "expected"),
    [
        (TelemetryConfig(), {}, None),
        (TelemetryConfig(), {ENDPOINT: "http://collector:4317"}, OtlpTarget("grpc", "http://collector:4317")),
        (TelemetryConfig(), {ENDPOINT: "collector:4317"}, OtlpTarget("grpc", "http://collector:4317")),
        (
            TelemetryConfig(),
            {ENDPOINT: "http://collector:4318/", PROTOCOL: "http/protobuf"},
            OtlpTarget("http/protobuf", "http://collector:4318/v1/traces"),
        ),
        (
            TelemetryConfig(),
            {
                ENDPOINT: "http://base:4318",
                TRACES_ENDPOINT: "https://traces:443/custom",
                PROTOCOL: "grpc",
                TRACES_PROTOCOL: "http/protobuf",
            },
            OtlpTarget("http/protobuf", "https://traces:443/custom"),
        ),
        (
            TelemetryConfig(otlp_endpoint="http://flag:4318", otlp_protocol="http/protobuf"),
            {ENDPOINT: "http://env:4317", PROTOCOL: "grpc"},
            OtlpTarget("http/protobuf", "http://flag:4318/v1/traces"),
        ),
        (
            TelemetryConfig(otlp_endpoint="http://flag:4318/v1/traces"),
            {PROTOCOL: "http/protobuf"},
            OtlpTarget("http/protobuf", "http://flag:4318/v1/traces"),
        ),
        (TelemetryConfig(), {ENDPOINT: "http://collector:4317", "OTEL_TRACES_EXPORTER": "none"}, None),
        (
            TelemetryConfig(otlp_endpoint="http://flag:4317"),
            {"OTEL_TRACES_EXPORTER": "none"},
            OtlpTarget("grpc", "http://flag:4317"),
        ),
        (TelemetryConfig(otlp_endpoint="http://flag:4317"), {"OTEL_SDK_DISABLED": "True"}, None),
    ],
)
def test_otlp_target_from_config_then_environment(
    config: TelemetryConfig, environ: dict[str, str], expected: OtlpTarget | None
) -> None:
    assert otlp_target(config, environ) == expected


def test_unknown_protocol_in_the_environment_is_refused() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        otlp_target(TelemetryConfig(), {ENDPOINT: "http://collector:4317", PROTOCOL: "http/json"})
    assert info.value.field == "otlp_protocol"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"otlp_endpoint": ""}, "otlp_endpoint"),
        ({"otlp_protocol": "udp"}, "otlp_protocol"),
        ({"metrics_port": 65536}, "metrics_port"),
        ({"metrics_port": -1}, "metrics_port"),
    ],
)
def test_invalid_config_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        TelemetryConfig(**kwargs)
    assert info.value.field == field


def test_flags_come_from_the_fields() -> None:
    parser = argparse.ArgumentParser()
    add_config_args(parser, TelemetryConfig)
    args = parser.parse_args(["--otlp-endpoint", "http://c:4317", "--otlp-protocol", "grpc", "--metrics-port", "0"])
    assert config_from_args(TelemetryConfig, args) == TelemetryConfig(
        otlp_endpoint="http://c:4317", otlp_protocol="grpc", metrics_port=0
    )
    assert config_from_args(TelemetryConfig, parser.parse_args([])) == TelemetryConfig()


class _RecordingExporter(telemetry.SpanExporter):
    made: ClassVar[list[tuple[str, str]]] = []

    def __init__(self, endpoint: str) -> None:
        self.made.append((type(self).__name__, endpoint))

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class _Http(_RecordingExporter):
    pass


class _Grpc(_RecordingExporter):
    pass


@pytest.mark.parametrize(
    ("protocol", "made"),
    [("grpc", ("_Grpc", "http://c:4317")), ("http/protobuf", ("_Http", "http://c:4317/v1/traces"))],
)
@pytest.mark.anyio
async def test_exporter_follows_the_protocol(
    monkeypatch: pytest.MonkeyPatch, protocol: str, made: tuple[str, str]
) -> None:
    monkeypatch.setattr(telemetry, "HttpSpanExporter", _Http)
    monkeypatch.setattr(telemetry, "GrpcSpanExporter", _Grpc)
    monkeypatch.setattr(_RecordingExporter, "made", [])
    config = TelemetryConfig(otlp_endpoint="http://c:4317", otlp_protocol=protocol, service_name="custom")
    tracing = setup_tracing(config, "decode", instance_id="decode-1", environ={})
    with tracing.span("s") as span:
        assert span.is_recording()
        resource = span.resource.attributes  # type: ignore[attr-defined]
    assert (resource["service.name"], resource["service.instance.id"], resource["pdserve.role"]) == (
        "custom",
        "decode-1",
        "decode",
    )
    assert _RecordingExporter.made == [made]
    await tracing.aclose()
