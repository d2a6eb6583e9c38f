"""Telemetry settings of every pdserve process (router, prefill and decode pods): traces and metrics.

Tracing is on when an OTLP endpoint is known: `--otlp-endpoint`, else the standard OpenTelemetry environment
variables. `otlp_target` is the one place that reads them (OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER,
OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL); the exporter's own knobs (headers,
TLS certificate, timeout, compression) stay the SDK's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from common.config import doc
from common.errors import InvalidArgumentError

Role = Literal["router", "prefill", "decode"]
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
_TRACES_PATH = "/v1/traces"


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    otlp_endpoint: str | None = field(
        default=None,
        metadata=doc(
            "OTLP collector for traces (e.g. http://otel-collector:4317); default: OTEL_EXPORTER_OTLP_[TRACES_]"
            "ENDPOINT, and with neither, tracing is off"
        ),
    )
    otlp_protocol: str | None = field(
        default=None,
        metadata=doc(f"OTLP protocol {OTLP_PROTOCOLS}; default: OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL, else grpc"),
    )
    service_name: str | None = field(
        default=None, metadata=doc("service.name of this process's spans; default: pdserve-<role>")
    )
    metrics_port: int | None = field(
        default=None, metadata=doc("port of the Prometheus /metrics endpoint (0: a free port); unset: no endpoint")
    )
    metrics_host: str = field(default="0.0.0.0", metadata=doc("address the /metrics endpoint binds"))

    def __post_init__(self) -> None:
        if self.otlp_endpoint is not None and not self.otlp_endpoint:
            raise InvalidArgumentError("otlp_endpoint", "must not be empty")
        if self.otlp_protocol is not None and self.otlp_protocol not in OTLP_PROTOCOLS:
            raise InvalidArgumentError("otlp_protocol", f"must be one of {OTLP_PROTOCOLS}, got {self.otlp_protocol!r}")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 1 << 16:
            raise InvalidArgumentError("metrics_port", f"must be in [0, 65535], got {self.metrics_port}")

    def resolved_service_name(self, role: Role) -> str:
        return self.service_name or f"pdserve-{role}"


@dataclass(frozen=True, slots=True)
class OtlpTarget:
    """Where spans go: the exporter's protocol and its full endpoint (for http/protobuf, the /v1/traces URL)."""

    protocol: str
    endpoint: str


def otlp_target(config: TelemetryConfig, environ: Mapping[str, str] | None = None) -> OtlpTarget | None:
    """The OTLP trace target of `config` and the standard OTEL_* variables of `environ` (default: os.environ);
    None when tracing is off. The config wins over the environment; OTEL_SDK_DISABLED=true turns tracing off."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    protocol = (
        config.otlp_protocol
        or env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    )
    if protocol not in OTLP_PROTOCOLS:
        raise InvalidArgumentError("otlp_protocol", f"must be one of {OTLP_PROTOCOLS}, got {protocol!r}")
    if config.otlp_endpoint is not None:
        return OtlpTarget(protocol, _full_endpoint(config.otlp_endpoint, protocol))
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return None
    # NOTE: per the OTLP exporter spec the signal-specific endpoint is used as it is; the base one gets /v1/traces.
    if signal_endpoint := env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return OtlpTarget(protocol, _with_scheme(signal_endpoint))
    if base_endpoint := env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return OtlpTarget(protocol, _full_endpoint(base_endpoint, protocol))
    return None


def _with_scheme(endpoint: str) -> str:
    """`host:port` -> `http://host:port`: without a scheme the gRPC exporter would pick TLS."""
    return endpoint if "://" in endpoint else f"http://{endpoint}"


def _full_endpoint(endpoint: str, protocol: str) -> str:
    url = _with_scheme(endpoint)
    if protocol == "http/protobuf" and urlsplit(url).path in ("", "/"):
        return url.rstrip("/") + _TRACES_PATH
    return url
