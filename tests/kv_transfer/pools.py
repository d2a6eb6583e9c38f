"""Small random KV pools for the kv_transfer tests (also built in the two-process tests' child)."""

from __future__ import annotations

import torch

BLOCK_SIZE = 4
POOL_SHAPE = (2, 2, BLOCK_SIZE, 2, 8)  # num_layers, K/V, block_size, num_kv_heads, head_dim


def random_pool(num_blocks: int, dtype: torch.dtype = torch.float32, seed: int = 0, head_dim: int = 8) -> torch.Tensor:
    """A pool [num_blocks, 2 layers, K/V, block_size 4, 2 kv heads, head_dim] of random values."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((num_blocks, *POOL_SHAPE[:-1], head_dim), generator=generator).to(dtype)
