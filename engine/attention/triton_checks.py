"""Argument checks shared by the Triton attention launchers (shapes, dtypes, unit strides)."""

from __future__ import annotations

import torch

KV_DTYPES = (torch.float8_e4m3fn,)
"""KV cache dtypes other than the query's that the kernels read (dequantized in registers)."""


def check_attention_args(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    output: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
) -> int:
    """Validates one attention launch and returns the GQA group size (query heads per KV head).

    query/output [T, Hq, D]; kv_cache [num_blocks, 2, block_size, Hkv, D] in the query's dtype (or fp8 under a
    16-bit query) with any strides but a unit one on D; query_start_loc [num_reqs + 1]; seq_lens [num_reqs];
    block_table [num_reqs, max_blocks].
    """
    if query.dim() != 3:
        raise ValueError(f"query {tuple(query.shape)} is not [T, Hq, D]")
    num_q_heads, head_dim = query.shape[1], query.shape[2]
    if kv_cache.dim() != 5 or kv_cache.shape[1] != 2 or kv_cache.shape[4] != head_dim:
        raise ValueError(f"kv_cache {tuple(kv_cache.shape)} is not [num_blocks, 2, block_size, Hkv, {head_dim}]")
    if num_q_heads % kv_cache.shape[3]:
        raise ValueError(f"{num_q_heads} query heads are not a multiple of {kv_cache.shape[3]} KV heads")
    kv_dtype_ok = kv_cache.dtype == query.dtype or (kv_cache.dtype in KV_DTYPES and query.dtype != torch.float32)
    if output.shape != query.shape or output.dtype != query.dtype or not kv_dtype_ok:
        raise ValueError(
            f"query {query.dtype}{tuple(query.shape)}, output {output.dtype}{tuple(output.shape)}, "
            f"kv_cache {kv_cache.dtype}"
        )
    if query.stride(2) != 1 or output.stride(2) != 1 or kv_cache.stride(4) != 1:
        raise ValueError("query, output and kv_cache need a unit stride on head_dim")
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim {head_dim} is not a power of two >= 16")
    num_reqs = seq_lens.shape[0]
    if query_start_loc.shape != (num_reqs + 1,) or block_table.dim() != 2 or block_table.shape[0] != num_reqs:
        raise ValueError(
            f"query_start_loc {tuple(query_start_loc.shape)}, block_table {tuple(block_table.shape)} "
            f"do not match {num_reqs} requests"
        )
    if block_table.stride(1) != 1:
        raise ValueError("block_table needs a unit stride on its columns")
    return num_q_heads // kv_cache.shape[3]
