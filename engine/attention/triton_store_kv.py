# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""Triton kernel that scatters one step's K/V rows into the paged pool, and its launcher."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, cache_ptr, slot_mapping_ptr, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_ckv, stride_ct, stride_ch,
    NUM_KV_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    # NOTE: a negative slot marks a padding token (e.g. a CUDA-graph batch padded past its requests).
    if slot < 0:
        return
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, HEAD_DIM)
    mask = (h < NUM_KV_HEADS)[:, None]
    dst = cache_ptr + (slot // PAGE) * stride_cb + (slot % PAGE) * stride_ct + h[:, None] * stride_ch + d[None, :]
    key = tl.load(key_ptr + token * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    value = tl.load(value_ptr + token * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    tl.store(dst, key, mask=mask)
    tl.store(dst + stride_ckv, value, mask=mask)


def store_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write key/value [T, Hkv, D] into kv_cache [num_blocks, 2, block_size, Hkv, D] at slot_mapping [T].

    kv_cache may be a strided view (one layer of the pool); slots < 0 are skipped.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if value.shape != key.shape or slot_mapping.shape != (num_tokens,):
        raise ValueError(
            f"key {tuple(key.shape)}, value {tuple(value.shape)}, slot_mapping {tuple(slot_mapping.shape)}"
        )
    if kv_cache.dim() != 5 or kv_cache.shape[1] != 2 or kv_cache.shape[3:] != (num_kv_heads, head_dim):
        raise ValueError(f"kv_cache {tuple(kv_cache.shape)} does not hold [*, 2, *, {num_kv_heads}, {head_dim}]")
    if key.dtype != kv_cache.dtype or value.dtype != kv_cache.dtype:
        raise ValueError(f"key/value dtype {key.dtype}/{value.dtype} differs from kv_cache {kv_cache.dtype}")
    if key.stride(2) != 1 or value.stride(2) != 1 or kv_cache.stride(4) != 1:
        raise ValueError("key, value and kv_cache need a unit stride on head_dim")
    if head_dim & (head_dim - 1):
        raise ValueError(f"head_dim {head_dim} is not a power of two")
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        key,
        value,
        kv_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        NUM_KV_HEADS=num_kv_heads,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
        PAGE=kv_cache.shape[2],
    )
