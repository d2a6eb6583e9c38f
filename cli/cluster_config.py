"""What a local pdserve cluster starts: `ClusterConfig`, the roles and the command each role runs.

Telemetry: every process serves Prometheus /metrics (`--metrics-port`): the router on `metrics_port`, the
first prefill pod on `metrics_port + 1`, the first decode pod on `metrics_port + 2`, further pods on free
ports (all on free ports with `metrics_port=0`; none with None); `otlp_endpoint` goes to every process.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from common.errors import InvalidArgumentError
from engine.config import DEFAULT_MODEL

Role = Literal["router", "prefill", "decode"]

ENTRY_POINTS: Mapping[Role, tuple[str, ...]] = {
    "router": (sys.executable, "-m", "router"),
    "prefill": (sys.executable, "-m", "prefill_service"),
    "decode": (sys.executable, "-m", "decode_service"),
}
"""The command that starts each role; its flags follow (see the service conventions)."""

DEFAULT_METRICS_PORT = 9100
METRICS_PORT_OFFSETS: Mapping[Role, int] = {"router": 0, "prefill": 1, "decode": 2}
"""Where the first process of each role serves /metrics, relative to `ClusterConfig.metrics_port`."""


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """What `LocalCluster` starts and how."""

    num_prefill: int = 1
    num_decode: int = 1
    host: str = "127.0.0.1"
    port: int = 50051
    """The router's port; 0 picks a free one."""
    redis_url: str | None = None
    """An existing Redis; None starts a throwaway redis-server (stopped with the cluster)."""
    model: str = DEFAULT_MODEL
    kv_transfer_backend: str = "tcp"
    registry_refresh_s: float = 1.0
    """How often the router re-reads the pod registry (its --registry-refresh-s)."""
    pod_args: tuple[str, ...] = ()
    """Extra flags for every pod (engine flags such as --num-blocks, --heartbeat-s)."""
    router_args: tuple[str, ...] = ()
    """Extra flags for the router."""
    log_dir: Path | None = None
    """Where each process writes `<name>.log`; None: a new temporary folder."""
    startup_timeout_s: float = 600.0
    stop_timeout_s: float = 35.0
    """How long a SIGTERMed process may take (pods drain in-flight requests) before it is killed."""
    show_progress: bool = False
    """A tqdm bar on stderr while the processes load."""
    metrics_port: int | None = DEFAULT_METRICS_PORT
    """The router's /metrics port; the first prefill and decode pods use the next two (see the module
    docstring); 0: free ports for every process; None: no /metrics endpoints."""
    otlp_endpoint: str | None = None
    """OTLP collector every process sends its spans to (their --otlp-endpoint); None: tracing off."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables of every process (e.g. OTEL_BSP_SCHEDULE_DELAY)."""
    entry_points: Mapping[Role, tuple[str, ...]] = field(default_factory=lambda: dict(ENTRY_POINTS))

    def __post_init__(self) -> None:
        for name in ("num_prefill", "num_decode"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(name, f"must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.port < 1 << 16:
            raise InvalidArgumentError("port", f"must be in [0, 65535], got {self.port}")
        if self.metrics_port is not None and not 0 <= self.metrics_port < (1 << 16) - 2:
            raise InvalidArgumentError("metrics_port", f"must be in [0, 65533], got {self.metrics_port}")
