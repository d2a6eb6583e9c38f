"""The attention backend interface every backend (torch reference, Triton) implements.

One step's batch is a flat run of tokens: request i owns query rows
`query_start_loc[i]:query_start_loc[i+1]`, which are the LAST tokens of its `seq_lens[i]`-token context
(a prefill chunk, a prefix-cache continuation and a decode token are the same case). The step's K/V are already
in the paged pool (the model's q/k norm + RoPE kernel stores them at `slot_mapping`); the backend attends
causally over each request's context.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step inputs shared by every attention layer (device tensors plus host copies)."""

    query_start_loc: torch.Tensor  # [num_reqs + 1] int32, cu_seqlens_q
    seq_lens: torch.Tensor  # [num_reqs] int32, context length after this step
    block_table: torch.Tensor  # [num_reqs, max_num_blocks] int32, padded with 0
    slot_mapping: torch.Tensor  # [num_tokens] int64, block_id * block_size + offset
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens_cpu)


class AttentionBackend(ABC):
    """Computes one layer's attention for the step over its pool slice."""

    def __init__(self, block_size: int, scale: float) -> None:
        self.block_size = block_size
        self.scale = scale

    @abstractmethod
    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        """query [T, Hq, D]; kv_cache is the layer's pool slice [num_blocks, 2, block_size, Hkv, D], holding this
        step's K/V too. Returns [T, Hq, D]."""

    def with_pdl(self) -> AttentionBackend:
        """The backend for a model whose one-row GEMVs launch early (`LinearMethod.gemv_pdl`): its decode kernels
        then launch early too, where it has such launches; default: itself."""
        return self


def store_kv(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor, block_size: int
) -> None:
    """Scatter the step's K/V rows into their paged slots (the torch reference of the fused store)."""
    block_ids = torch.div(slot_mapping, block_size, rounding_mode="floor")
    offsets = slot_mapping % block_size
    kv_cache[block_ids, 0, offsets] = key
    kv_cache[block_ids, 1, offsets] = value
