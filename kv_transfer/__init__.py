"""Moving KV blocks from prefill to decode: one interface (`base`), backends `tcp`, `cuda_ipc`, `nccl` and
`in_process`, picked by name (`factory`).

See `kv_transfer.base` for the lifecycle of a transfer and who owns which blocks when. The socket backends (tcp,
cuda_ipc, nccl) share one control plane (`kv_transfer.control`) and differ in how the bytes move; each
subpackage's docstring writes out its lifecycle.

The value types (`KVLayout`, `KVTarget`, `KVPoolView`, the states and errors) import no torch, so the router can
carry KV targets; the senders, receivers and the factory are loaded on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kv_transfer.config import BACKENDS, KVTransferConfig
from kv_transfer.layout import KVLayout
from kv_transfer.pool_view import KVPoolView
from kv_transfer.state import (
    InvalidChunkError,
    LayoutMismatchError,
    TransferAbortedError,
    TransferError,
    TransferExpiredError,
    TransferState,
    TransferStateError,
    TransportError,
    UnknownTransferError,
)
from kv_transfer.target import KVTarget

if TYPE_CHECKING:
    from kv_transfer.base import KVReceiver, KVSender, TransferStats
    from kv_transfer.factory import make_receiver, make_sender

_LAZY = {
    "KVReceiver": "kv_transfer.base",
    "KVSender": "kv_transfer.base",
    "TransferStats": "kv_transfer.base",
    "make_receiver": "kv_transfer.factory",
    "make_sender": "kv_transfer.factory",
}

__all__ = [
    "BACKENDS",
    "InvalidChunkError",
    "KVLayout",
    "KVPoolView",
    "KVReceiver",
    "KVSender",
    "KVTarget",
    "KVTransferConfig",
    "LayoutMismatchError",
    "TransferAbortedError",
    "TransferError",
    "TransferExpiredError",
    "TransferState",
    "TransferStateError",
    "TransferStats",
    "TransportError",
    "UnknownTransferError",
    "make_receiver",
    "make_sender",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
