"""Which GPU a pool is on, as both ranks of an nccl pair can compare it: the device's UUID."""

from __future__ import annotations

import torch

from kv_transfer.state import ProtocolError, TransportError


def device_uuid(device: torch.device) -> str | None:
    """The GPU's UUID, the same in every process whatever CUDA_VISIBLE_DEVICES numbers it; None for the host."""
    if device.type != "cuda":
        return None
    return str(torch.cuda.get_device_properties(device).uuid)


def check_distinct_gpus(sender: object, receiver: str | None) -> None:
    """Refuse a sender on the receiver's own GPU: NCCL cannot connect two ranks on one device."""
    if sender is not None and not isinstance(sender, str):
        raise ProtocolError(f"an nccl HELLO names the sender's GPU by UUID, got {sender!r}")
    if receiver is not None and sender == receiver:
        raise TransportError(
            f"nccl cannot connect two ranks on one GPU, and the prefill and decode pools are both on GPU {receiver}: "
            "put them on different GPUs, or use kv_transfer_backend 'cuda_ipc' on one host"
        )
