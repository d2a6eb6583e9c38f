"""Settings of the prefill and decode pods' processes: gRPC server, registry, KV transfer, and `PodConfig`, the
whole of one pod's settings (`parse_pod_config` reads it from the pod's flags).

Each dataclass becomes CLI flags with `common.config.add_config_args` (field `kv_lease_s` -> `--kv-lease-s`);
the engine's own settings come from engine.config. Values measured at run time (the bound port, the pod's
generation) live in the running pod, never here.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from common.config import add_config_args, config_from_args, doc
from common.errors import InvalidArgumentError
from common.telemetry_config import TelemetryConfig
from common.tls import ClusterTLSConfig
from engine.config import ENGINE_FLAG_PARTS, EngineConfig, SchedulerConfig, engine_config_from_args
from kv_transfer.config import BACKENDS, check_backend
from pod.admission import AdmissionLimits

_WILDCARD_HOSTS = ("0.0.0.0", "::")
POD_BACKENDS = tuple(backend for backend in BACKENDS if backend != "in_process")
"""The KV transfer backends between pods (in_process only joins a sender and a receiver of one process)."""
_QUEUED_BATCHES = 4
_MIN_WAITING = 256
_QUEUED_STEPS = 8


def _require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise InvalidArgumentError(field_name, message)


def _check_port(field_name: str, port: int) -> None:
    _require(0 <= port < 1 << 16, field_name, f"must be in [0, 65535], got {port}")


@dataclass(frozen=True, slots=True)
class PodServerConfig:
    host: str = field(default="127.0.0.1", metadata=doc("address the gRPC server and a decode pod's KV receiver bind"))
    port: int = field(default=0, metadata=doc("gRPC port (0: a free port; the pod registers the real one)"))
    advertise_host: str | None = field(
        default=None, metadata=doc("host other services dial; default: --host (the hostname for 0.0.0.0)")
    )
    drain_timeout_s: float = field(default=30.0, metadata=doc("on SIGTERM, how long in-flight requests may finish"))

    def __post_init__(self) -> None:
        _require(bool(self.host), "host", "must not be empty")
        _check_port("port", self.port)
        _require(self.drain_timeout_s >= 0, "drain_timeout_s", f"must be >= 0, got {self.drain_timeout_s}")

    @property
    def public_host(self) -> str:
        """The host the pod registers: --advertise-host, else --host (this machine's name for a wildcard bind)."""
        if self.advertise_host:
            return self.advertise_host
        return socket.gethostname() if self.host in _WILDCARD_HOSTS else self.host


@dataclass(frozen=True, slots=True)
class RegistryConfig:
    redis_url: str = field(default="redis://127.0.0.1:6379/0", metadata=doc("Redis of the pod registry and directory"))
    pod_id: str | None = field(default=None, metadata=doc("this pod's id; default: its role and a random suffix"))
    heartbeat_s: float = field(default=1.0, metadata=doc("registry heartbeat period; the entry lives 3 periods"))

    def __post_init__(self) -> None:
        _require(
            self.redis_url.startswith(("redis://", "rediss://", "unix://")),
            "redis_url",
            f"must be a redis:// URL, got {self.redis_url!r}",
        )
        _require(self.pod_id is None or bool(self.pod_id), "pod_id", "must not be empty")
        _require(self.heartbeat_s > 0, "heartbeat_s", f"must be > 0, got {self.heartbeat_s}")


@dataclass(frozen=True, slots=True)
class PodTransferConfig:
    kv_transfer_backend: str = field(
        default="tcp", metadata=doc(f"how KV blocks move prefill -> decode: {POD_BACKENDS}")
    )
    # NOTE: the lease only bounds how long KV stays stranded when a peer dies (cancels free at once); 30 s
    # leaves room for a prefill queued behind a burst on a loaded CPU host, where 10 s lapsed in tests.
    kv_lease_s: float = field(
        default=30.0,
        metadata=doc(
            "decode: how long a reservation waits for its claim or next chunk; prefill: for the next ack, and "
            "the decode lease assumed for KV targets that name none"
        ),
    )
    kv_connect_timeout_s: float = field(default=5.0, metadata=doc("prefill: KV connect and handshake timeout"))

    def __post_init__(self) -> None:
        check_backend(self.kv_transfer_backend)
        _require(
            self.kv_transfer_backend != "in_process",
            "kv_transfer_backend",
            "in_process moves KV within one process; pods run their engines in processes of their own (use tcp)",
        )
        _require(self.kv_lease_s > 0, "kv_lease_s", f"must be > 0, got {self.kv_lease_s}")
        _require(self.kv_connect_timeout_s > 0, "kv_connect_timeout_s", f"must be > 0, got {self.kv_connect_timeout_s}")


@dataclass(frozen=True, slots=True)
class KVReceiverConfig:
    kv_port: int = field(
        default=0,
        metadata=doc("decode: KV receiver port (0: a free port); it binds --host; rank r of a parallel pod: port + r"),
    )

    def __post_init__(self) -> None:
        _check_port("kv_port", self.kv_port)


@dataclass(frozen=True, slots=True)
class PodAdmissionConfig:
    admission_max_waiting_requests: int | None = field(
        default=None,
        metadata=doc(
            "prefill: calls waiting for their first token; decode: reservations not yet decoding; beyond "
            "it RESOURCE_EXHAUSTED + RetryInfo; default: 4 x --max-num-seqs, at least 256; 0: no limit"
        ),
    )
    admission_max_queued_prompt_tokens: int | None = field(
        default=None,
        metadata=doc("prompt tokens of those requests; default: 8 steps of --max-num-batched-tokens; 0: no limit"),
    )
    admission_max_retry_s: float = field(default=5.0, metadata=doc("most retry delay a refusal advertises"))

    def __post_init__(self) -> None:
        for name in ("admission_max_waiting_requests", "admission_max_queued_prompt_tokens"):
            value = getattr(self, name)
            _require(value is None or value >= 0, name, f"must be >= 0, got {value}")
        _require(
            self.admission_max_retry_s > 0, "admission_max_retry_s", f"must be > 0, got {self.admission_max_retry_s}"
        )

    def limits(self, scheduler: SchedulerConfig) -> AdmissionLimits:
        """The limits, defaults derived from the engine's batch: 4 batches of requests (at least 256), 8 steps of
        tokens. NOTE: a safety valve for the pod; the router's tighter limits (router.config) do the shaping."""
        max_waiting, max_tokens = self.admission_max_waiting_requests, self.admission_max_queued_prompt_tokens
        return AdmissionLimits(
            max(_QUEUED_BATCHES * scheduler.max_num_seqs, _MIN_WAITING) if max_waiting is None else max_waiting,
            _QUEUED_STEPS * scheduler.max_num_batched_tokens if max_tokens is None else max_tokens,
            max_retry_s=self.admission_max_retry_s,
        )


@dataclass(frozen=True, slots=True)
class PodConfig:
    """One pod's settings: its process, its engine and its telemetry (`receiver` only on decode pods); `tls`: mutual
    TLS on its gRPC server and KV sockets (off by default)."""

    server: PodServerConfig
    registry: RegistryConfig
    transfer: PodTransferConfig
    engine: EngineConfig
    telemetry: TelemetryConfig
    receiver: KVReceiverConfig | None = None
    tls: ClusterTLSConfig = field(default_factory=ClusterTLSConfig)
    admission: PodAdmissionConfig = field(default_factory=PodAdmissionConfig)


def parse_pod_config(
    role: str, argv: list[str] | None, with_receiver: bool, environ: Mapping[str, str] | None = None
) -> PodConfig:
    """The config of `pdserve <role>` from its flags, else its `PDSERVE_*` variables of `environ` (default:
    os.environ); a bad value exits with a usage error naming its flag or variable."""
    parser = argparse.ArgumentParser(prog=f"pdserve {role}", description=f"Run a {role} pod.")
    parts: list[type] = [PodServerConfig, RegistryConfig, PodTransferConfig, PodAdmissionConfig]
    if with_receiver:
        parts.append(KVReceiverConfig)
    for cls in (*parts, *ENGINE_FLAG_PARTS, TelemetryConfig, ClusterTLSConfig):
        add_config_args(parser, cls)
    args = parser.parse_args(argv)
    try:
        config = PodConfig(
            config_from_args(PodServerConfig, args, environ=environ),
            config_from_args(RegistryConfig, args, environ=environ),
            config_from_args(PodTransferConfig, args, environ=environ),
            engine_config_from_args(args, environ),
            config_from_args(TelemetryConfig, args, environ=environ),
            config_from_args(KVReceiverConfig, args, environ=environ) if with_receiver else None,
            config_from_args(ClusterTLSConfig, args, environ=environ),
            config_from_args(PodAdmissionConfig, args, environ=environ),
        )
    except InvalidArgumentError as exc:
        parser.error(str(exc))
    return config
