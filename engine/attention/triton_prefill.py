# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""Varlen paged attention for prefill chunks (query length > 1), and its launcher.

Grid (T // BLOCK_Q + num_reqs, num_kv_heads). Program p serves one tile of BLOCK_Q query tokens of one
request for all query heads of one GQA group: the tile's rows are (token, head-in-group) pairs, so each K/V
block is loaded once per KV head. Request i owns programs [qsl[i] // BLOCK_Q + i, qsl[i+1] // BLOCK_Q + i + 1),
at least ceil(q_len / BLOCK_Q) of them; a program past its request's last tile exits. The queries are the
last q_len positions of a seq_len context: K/V blocks before the tile's first position need no mask, the
rest take the causal one. Requests with query length 1 are left untouched (the decode kernel owns them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.attention.triton_checks import check_attention_args
from engine.attention.triton_decode import kv_to_query_dtype


@dataclass(slots=True, frozen=True)
class PrefillTiles:
    """Launch shape of the prefill kernel; block_m counts (token, head) rows."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3


FP32_PREFILL_TILES = PrefillTiles(block_m=64, block_n=32, num_warps=8, num_stages=2)


@triton.jit
def _find_request(query_start_loc_ptr, program, num_reqs, BLOCK_Q: tl.constexpr):
    """Largest i with query_start_loc[i] // BLOCK_Q + i <= program (binary search)."""
    lo: tl.int32 = 0
    hi = num_reqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= program:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attend(
    q,
    m_i,
    l_i,
    acc,
    table,
    cache_ptr,
    start,
    pos,
    seq_len,
    kv_head,
    qk_scale,
    k_scale,
    v_scale,
    stride_cb,
    stride_ckv,
    stride_ct,
    stride_ch,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """One online-softmax step of a [BLOCK_M, HEAD_DIM] query tile over K/V positions [start, start + BLOCK_N)."""
    n = start + tl.arange(0, BLOCK_N)
    d = tl.arange(0, HEAD_DIM)
    if CAUSAL:
        n_mask = n < seq_len
        block = tl.load(table + n // PAGE, mask=n_mask, other=0).to(tl.int64)
    else:
        block = tl.load(table + n // PAGE).to(tl.int64)
    rows = cache_ptr + block * stride_cb + (n % PAGE) * stride_ct + kv_head * stride_ch
    if CAUSAL:
        k_t = tl.load(rows[None, :] + d[:, None], mask=n_mask[None, :], other=0.0)
        v = tl.load(rows[:, None] + stride_ckv + d[None, :], mask=n_mask[:, None], other=0.0)
    else:
        k_t = tl.load(rows[None, :] + d[:, None])
        v = tl.load(rows[:, None] + stride_ckv + d[None, :])
    k_t = kv_to_query_dtype(k_t, k_scale, q, KV_FP8)
    v = kv_to_query_dtype(v, v_scale, q, KV_FP8)
    s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale
    if CAUSAL:
        s = tl.where((n[None, :] <= pos[:, None]) & n_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["num_reqs"])
def _prefill_kernel(
    q_ptr,
    cache_ptr,
    out_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    block_table_ptr,
    qk_scale,
    k_scale,
    v_scale,
    num_reqs,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_ckv,
    stride_ct,
    stride_ch,
    stride_ot,
    stride_oh,
    stride_bt,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    # NOTE: reversed program order starts the long causal tiles (late in their prompt) first.
    program = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    req = _find_request(query_start_loc_ptr, program, num_reqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    q0 = (program - q_start // BLOCK_Q - req) * BLOCK_Q
    if (q0 >= q_len) | (q_len == 1):
        return
    seq_len = tl.load(seq_lens_ptr + req)
    context_len = seq_len - q_len

    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, HEAD_DIM)
    token = q0 + r // GROUP_PAD
    heads = kv_head * GROUP + r % GROUP_PAD
    row_mask = (token < q_len) & (r % GROUP_PAD < GROUP)
    q_rows = (q_start + token) * stride_qt + heads * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=row_mask[:, None], other=0.0)
    pos = context_len + token
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    table = block_table_ptr + req * stride_bt
    # Positions below the tile's first query position are visible to every row of the tile.
    full_hi = (context_len + q0) // BLOCK_N * BLOCK_N
    for start in range(0, full_hi, BLOCK_N):
        m_i, l_i, acc = _attend(
            q,
            m_i,
            l_i,
            acc,
            table,
            cache_ptr,
            start,
            pos,
            seq_len,
            kv_head,
            qk_scale,
            k_scale,
            v_scale,
            stride_cb,
            stride_ckv,
            stride_ct,
            stride_ch,
            HEAD_DIM,
            PAGE,
            BLOCK_N,
            False,
            DOT_PRECISION,
            KV_FP8,
        )
    causal_hi = tl.minimum(seq_len, context_len + q0 + BLOCK_Q)
    for start in range(full_hi, causal_hi, BLOCK_N):
        m_i, l_i, acc = _attend(
            q,
            m_i,
            l_i,
            acc,
            table,
            cache_ptr,
            start,
            pos,
            seq_len,
            kv_head,
            qk_scale,
            k_scale,
            v_scale,
            stride_cb,
            stride_ckv,
            stride_ct,
            stride_ch,
            HEAD_DIM,
            PAGE,
            BLOCK_N,
            True,
            DOT_PRECISION,
            KV_FP8,
        )
    out = acc / l_i[:, None]
    dst = out_ptr + ((q_start + token) * stride_ot + heads * stride_oh)[:, None] + d[None, :]
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


def prefill_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    output: torch.Tensor,
    scale: float,
    tiles: PrefillTiles | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> None:
    """Causal attention of every request whose query length is > 1 over its paged context, into output.

    query/output [T, Hq, D]; kv_cache [num_blocks, 2, block_size, Hkv, D] (any strides, unit on D) already
    holding this step's K/V; query_start_loc [num_reqs + 1], seq_lens [num_reqs], block_table [num_reqs, *].
    A float8_e4m3fn kv_cache holds K / kv_scales[0] and V / kv_scales[1].
    """
    group = check_attention_args(query, kv_cache, output, query_start_loc, seq_lens, block_table)
    if tiles is None:
        tiles = FP32_PREFILL_TILES if query.dtype == torch.float32 else PrefillTiles()
    group_pad = triton.next_power_of_2(group)
    block_m = max(tiles.block_m, group_pad, 16)
    num_reqs = seq_lens.shape[0]
    block_q = block_m // group_pad
    grid = (query.shape[0] // block_q + num_reqs, kv_cache.shape[3])
    _prefill_kernel[grid](
        query,
        kv_cache,
        output,
        query_start_loc,
        seq_lens,
        block_table,
        scale * 1.4426950408889634,
        kv_scales[0],
        kv_scales[1],
        num_reqs,
        query.stride(0),
        query.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        output.stride(0),
        output.stride(1),
        block_table.stride(0),
        GROUP=group,
        GROUP_PAD=group_pad,
        HEAD_DIM=query.shape[2],
        PAGE=kv_cache.shape[2],
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        BLOCK_N=tiles.block_n,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        KV_FP8=kv_cache.dtype == torch.float8_e4m3fn,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
