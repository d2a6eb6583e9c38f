"""The executor-facing seam of KV transfer: one rank's KV pool, as the engine hands it to a sender or receiver.

A pod's engine gives one view per rank (`LLMEngine.kv_pool_views`); each backend reads or writes one view, so a
tensor- or pipeline-parallel pod ships its KV rank to rank over one transfer per view (`kv_transfer.ranked`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kv_transfer.layout import KVRank

if TYPE_CHECKING:
    import torch


@dataclass(slots=True, frozen=True)
class KVPoolView:
    """One rank's KV pool: a contiguous tensor shaped like `kv_transfer.layout.POOL_DIMS`, and which slice of its pod's
    KV it holds."""

    pool: torch.Tensor
    block_size: int
    rank: KVRank = field(default_factory=KVRank)
    ipc_handle: Mapping[str, Any] | None = None
    """The pool's CUDA IPC handle (`kv_transfer.cuda_ipc.pool_handle.PoolHandle.to_dict`) as the process that
    allocated it exported it, where that is another process (a parallel engine's worker); None: this process's own
    pool, or a host pool."""
