"""The messages of a pod's handshake with its engine core process (engine.core.process): the `CoreSpec` the pod
sends first, and the core's answer, `CoreReady` or `CoreFailed`. NOTE: apart from the process, so that the pod's
front, which only sends and reads them, imports neither the engine nor torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from common.tls import ClusterTLSConfig
from engine.config import EngineConfig, SchedulerConfig
from engine.core.outputs import EngineLoad
from engine.runtime_info import RuntimeInfo
from kv_transfer.layout import KVLayout

Role = Literal["prefill", "decode", "colocated"]


@dataclass(frozen=True, slots=True)
class CoreSpec:
    """What an engine core needs: its engine, and how to open the role's KV transfer end (a colocated engine, the
    benchmarks' baseline, has none)."""

    role: Role
    engine: EngineConfig
    kv_transfer_backend: str = "tcp"
    tls: ClusterTLSConfig = field(default_factory=ClusterTLSConfig)
    kv_lease_s: float = 30.0
    """Prefill: the sender's lease (how long it waits for an ack)."""
    kv_connect_timeout_s: float = 5.0
    kv_host: str = "127.0.0.1"
    """Decode: where the receiver listens (`kv_port`; rank r of a parallel pod on kv_port + r) and the host it
    advertises."""
    kv_port: int = 0
    kv_advertise_host: str | None = None


@dataclass(frozen=True, slots=True)
class CoreReady:
    """The core's first answer: the engine loaded and the KV end open."""

    info: RuntimeInfo
    scheduler: SchedulerConfig
    """The engine's scheduler settings as resolved for its device (the pod's admission defaults follow them)."""
    kv_endpoint: str
    """Decode: where prefill pods reach the receiver ("" on a prefill pod)."""
    kv_layout: KVLayout | None
    """The KV transfer end's layout (None on a colocated engine)."""
    load: EngineLoad


@dataclass(frozen=True, slots=True)
class CoreFailed:
    """The core could not start, or a turn failed: it exits 1."""

    message: str
