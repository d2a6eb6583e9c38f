"""Moving KV blocks from prefill to decode: one interface (`base`), backends `tcp`, `cuda_ipc`, `nccl` and
`in_process`, picked by name (`factory`).

See `kv_transfer.base` for the lifecycle of a transfer and who owns which blocks when. The socket backends (tcp,
cuda_ipc, nccl) share one control plane (`kv_transfer.tcp`) and differ in how the bytes move; each subpackage's
docstring writes out its lifecycle.
"""

from kv_transfer.base import KVReceiver, KVSender, TransferStats
from kv_transfer.config import BACKENDS, KVTransferConfig
from kv_transfer.factory import make_receiver, make_sender
from kv_transfer.layout import KVLayout
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

__all__ = [
    "BACKENDS",
    "InvalidChunkError",
    "KVLayout",
    "KVReceiver",
    "KVSender",
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
