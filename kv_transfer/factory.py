"""Pick a KV transfer backend by name (`KVTransferConfig.backend`); the request path does not change with it."""

from __future__ import annotations

import torch

from kv_transfer.base import KVReceiver, KVSender, TransferHook, ignore_hook
from kv_transfer.config import check_backend
from kv_transfer.in_process import InProcessReceiver, InProcessSender
from kv_transfer.tcp import TcpReceiver, TcpSender


def make_sender(
    backend: str,
    pool: torch.Tensor,
    block_size: int,
    *,
    lease_s: float = 30.0,
    connect_timeout_s: float = 5.0,
    on_finished: TransferHook = ignore_hook,
) -> KVSender:
    """The prefill side's sender over `pool`; InvalidArgumentError("kv_transfer_backend") for unknown backends."""
    check_backend(backend)
    if backend == "in_process":
        return InProcessSender(pool, block_size, lease_s=lease_s, on_finished=on_finished)
    return TcpSender(pool, block_size, lease_s=lease_s, connect_timeout_s=connect_timeout_s, on_finished=on_finished)


def make_receiver(
    backend: str,
    pool: torch.Tensor,
    block_size: int,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    advertise_host: str | None = None,
    on_released: TransferHook = ignore_hook,
) -> KVReceiver:
    """The decode side's receiver into `pool` (host/port matter to tcp only); same error for unknown backends."""
    check_backend(backend)
    if backend == "in_process":
        return InProcessReceiver(pool, block_size, on_released=on_released)
    return TcpReceiver(pool, block_size, host, port, advertise_host=advertise_host, on_released=on_released)
