"""Attention layer: a thin module handing q/k/v and its pool slice to the chosen backend."""

from __future__ import annotations

import torch
from torch import nn

from engine.attention.backend import AttentionBackend, AttentionMetadata


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, backend: AttentionBackend) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.backend = backend

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq * D]."""
        out = self.backend.forward(q, k, v, kv_cache, metadata)
        return out.reshape(out.shape[0], self.num_heads * self.head_dim)
