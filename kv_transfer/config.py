"""KV transfer configuration; services compose it under the flag prefix `kv_transfer_` (--kv-transfer-backend)."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.config import doc
from common.errors import InvalidArgumentError

BACKENDS = ("tcp", "cuda_ipc", "nccl", "in_process")
# NOTE: these move bytes GPU to GPU; they refuse pools on the host (`tcp` takes those).
DEVICE_BACKENDS = ("cuda_ipc", "nccl")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise InvalidArgumentError("kv_transfer_backend", f"unknown KV transfer backend {backend!r}; one of {BACKENDS}")


@dataclass(frozen=True, slots=True)
class KVTransferConfig:
    backend: str = field(default="tcp", metadata=doc(f"how KV blocks move from prefill to decode: {BACKENDS}"))
    host: str = field(default="0.0.0.0", metadata=doc("decode: address the KV receiver listens on"))
    port: int = field(default=0, metadata=doc("decode: KV receiver port (0: a free port)"))
    advertise_host: str | None = field(
        default=None,
        metadata=doc(
            "decode: host senders dial; default: the bind host, or this machine's hostname for a wildcard bind"
        ),
    )
    lease_s: float = field(
        default=30.0, metadata=doc("prefill: how long shipped blocks stay pinned without an ack from the receiver")
    )
    connect_timeout_s: float = field(default=5.0, metadata=doc("prefill: connect and handshake timeout, seconds"))

    def __post_init__(self) -> None:
        check_backend(self.backend)
        if not 0 <= self.port < 1 << 16:
            raise InvalidArgumentError("kv_transfer_port", f"must be in [0, 65535], got {self.port}")
        if not self.lease_s > 0:
            raise InvalidArgumentError("kv_transfer_lease_s", f"must be > 0, got {self.lease_s}")
        if not self.connect_timeout_s > 0:
            raise InvalidArgumentError("kv_transfer_connect_timeout_s", f"must be > 0, got {self.connect_timeout_s}")
