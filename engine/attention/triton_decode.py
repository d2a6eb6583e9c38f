# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""Split-KV (flash-decoding) paged attention for requests with one query token, and its launcher.

Grid (num_reqs, num_kv_heads, num_splits): each program loads every K/V row of its context partition once
and serves all query heads of its GQA group in one [BLOCK_G, HEAD_DIM] tile. With more than one split, the
programs write normalised partial outputs and their log2-sum-exp, and a second kernel combines them.
Requests whose query length is not 1 are left untouched (the prefill kernel owns them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.attention.triton_checks import check_attention_args
from engine.layers.pdl import pdl_launch, pdl_supported


@dataclass(slots=True, frozen=True)
class DecodeTiles:
    """Launch shape of the decode kernel."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def kv_to_query_dtype(x, scale, like, KV_FP8: tl.constexpr):
    """K or V rows as loaded from the cache, in the query's dtype (`like`): an fp8 cache holds x / scale."""
    # NOTE: one return: the compiler types every return statement, also one after a constexpr branch that returned.
    if KV_FP8:  # noqa: SIM108 (a statement: the compiler then types the taken branch only)
        y = (x.to(tl.float32) * scale).to(like.dtype)
    else:
        y = x
    return y


@triton.jit
def fp8_to_f16(x):
    """float8_e4m3fn -> float16, 4 values per instance (two cvt.rn.f16x2.e4m3x2). Inline assembly, so the compiler
    cannot move the conversion behind the tile's shuffle into the dot operand layout: it then shuffles 16-bit
    values (ldmatrix) instead of reading shared memory byte by byte."""
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r",
        [x.to(tl.uint8, bitcast=True)],
        dtype=tl.float16,
        is_pure=True,
        pack=4,
    )


@triton.jit
def to_compute_dtype(q, KV_FP8: tl.constexpr):
    """The query in the dots' dtype: float16 over an fp8 pool (fp8 converts to float16 in one instruction per two
    values, to bfloat16 in three), else as it is."""
    if KV_FP8:  # noqa: SIM108 (one return: see kv_to_query_dtype)
        y = q.to(tl.float16)
    else:
        y = q
    return y


@triton.jit
def kv_tile(x, KV_FP8: tl.constexpr, FP8_ASM: tl.constexpr):
    """A loaded K or V tile in the dots' dtype (float16 for an fp8 pool; its scales are applied outside the loop)."""
    if KV_FP8 and FP8_ASM:
        y = fp8_to_f16(x)
    elif KV_FP8:
        y = x.to(tl.float16)
    else:
        y = x
    return y


@triton.jit(do_not_specialize=["num_splits"])
def _decode_kernel(
    q_ptr,
    cache_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    block_table_ptr,
    qk_scale,
    v_scale,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_ckv,
    stride_ct,
    stride_ch,
    stride_ot,
    stride_oh,
    stride_bt,
    num_q_heads,
    num_splits,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
    FP8_ASM: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        tl.extra.cuda.gdc_wait()  # NOTE: a PDL launch (engine.layers.pdl): q and the step's K/V are just written
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + req)
    if tl.load(query_start_loc_ptr + req + 1) - q_start != 1:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    split_len = ((seq_len + num_splits - 1) // num_splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    lo = split * split_len
    hi = tl.minimum(lo + split_len, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HEAD_DIM)
    g_mask = g < GROUP
    heads = kv_head * GROUP + g
    q = tl.load(q_ptr + q_start * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=g_mask[:, None], other=0.0)
    q = to_compute_dtype(q, KV_FP8)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
    table = block_table_ptr + req * stride_bt
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_mask = n < hi
        block = tl.load(table + n // PAGE, mask=n_mask, other=0).to(tl.int64)
        rows = cache_ptr + block * stride_cb + (n % PAGE) * stride_ct + kv_head * stride_ch
        # NOTE: whole tiles go to the dots' dtype with no scale (a no-op on a pool in the query's dtype): the fp8
        # pool's k_scale is inside qk_scale and its v_scale multiplies the sums once, after the loop.
        k_t = kv_tile(tl.load(rows[None, :] + d[:, None], mask=n_mask[None, :], other=0.0), KV_FP8, FP8_ASM)
        s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if KV_FP8:
            # NOTE: loaded as V^T, converted, then transposed in registers: the compiler then shuffles V into the dot
            # operand layout as float16 (ldmatrix) instead of reading fp8 bytes one at a time from shared memory.
            v_t = tl.load(rows[None, :] + stride_ckv + d[:, None], mask=n_mask[None, :], other=0.0)
            v = tl.trans(kv_tile(v_t, KV_FP8, FP8_ASM))
        else:
            v = tl.load(rows[:, None] + stride_ckv + d[None, :], mask=n_mask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    acc = acc * v_scale

    if not SPLIT:
        out = acc / l_i[:, None]
        dst = out_ptr + q_start * stride_ot + heads[:, None] * stride_oh + d[None, :]
        tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
    else:
        # NOTE: an empty partition (short context) writes lse = -inf and zeros, which the reduce weighs 0.
        has_rows = l_i > 0
        out = acc / tl.where(has_rows, l_i, 1.0)[:, None]
        lse = tl.where(has_rows, m_i + tl.log2(tl.where(has_rows, l_i, 1.0)), float("-inf"))
        part = (req * num_splits + split) * num_q_heads + heads
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + d[None, :], out, mask=g_mask[:, None])
        tl.store(part_lse_ptr + part, lse, mask=g_mask)


@triton.jit(do_not_specialize=["num_splits"])
def _reduce_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    query_start_loc_ptr,
    stride_ot,
    stride_oh,
    num_q_heads,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        tl.extra.cuda.gdc_wait()  # NOTE: a PDL launch: the partials are the previous kernel's
    req = tl.program_id(0)
    head = tl.program_id(1)
    q_start = tl.load(query_start_loc_ptr + req)
    if tl.load(query_start_loc_ptr + req + 1) - q_start != 1:
        return
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, HEAD_DIM)
    s_mask = s < num_splits
    part = (req * num_splits + s) * num_q_heads + head
    lse = tl.load(part_lse_ptr + part, mask=s_mask, other=float("-inf"))
    weight = tl.exp2(lse - tl.max(lse, 0))
    parts = tl.load(part_out_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=s_mask[:, None], other=0.0)
    out = tl.sum(parts * weight[:, None], 0) / tl.sum(weight, 0)
    tl.store(out_ptr + q_start * stride_ot + head * stride_oh + d, out.to(out_ptr.dtype.element_ty))


def decode_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    output: torch.Tensor,
    scale: float,
    num_splits: int,
    tiles: DecodeTiles | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
    pdl: bool = False,
) -> None:
    """Attention of every request whose query length is 1 over its paged context, written into output.

    query/output [T, Hq, D]; kv_cache [num_blocks, 2, block_size, Hkv, D] (any strides, unit on D);
    query_start_loc [num_reqs + 1], seq_lens [num_reqs], block_table [num_reqs, max_blocks] (int32).
    Correct for any num_splits >= 1, which only sets how finely each context is partitioned. A float8_e4m3fn
    kv_cache holds K / kv_scales[0] and V / kv_scales[1] (read back in the query's dtype). `pdl`: both launches
    early (where `pdl_supported`), each waiting for the kernel before it ahead of its first load.
    """
    group = check_attention_args(query, kv_cache, output, query_start_loc, seq_lens, block_table)
    num_kv_heads, head_dim = kv_cache.shape[3], kv_cache.shape[4]
    if num_splits < 1:
        raise ValueError(f"num_splits {num_splits} < 1")
    tiles = tiles or DecodeTiles()
    pdl = pdl and pdl_supported(query.device)
    num_reqs = seq_lens.shape[0]
    num_q_heads = query.shape[1]
    if num_splits > 1:
        part_out = torch.empty((num_reqs, num_splits, num_q_heads, head_dim), dtype=torch.float32, device=query.device)
        part_lse = torch.empty((num_reqs, num_splits, num_q_heads), dtype=torch.float32, device=query.device)
    else:
        part_out = part_lse = output
    _decode_kernel[(num_reqs, num_kv_heads, num_splits)](
        query,
        kv_cache,
        output,
        part_out,
        part_lse,
        query_start_loc,
        seq_lens,
        block_table,
        scale * 1.4426950408889634 * kv_scales[0],
        kv_scales[1],
        query.stride(0),
        query.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        output.stride(0),
        output.stride(1),
        block_table.stride(0),
        num_q_heads,
        num_splits,
        GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        PAGE=kv_cache.shape[2],
        BLOCK_N=tiles.block_n,
        SPLIT=num_splits > 1,
        KV_FP8=kv_cache.dtype == torch.float8_e4m3fn,
        # NOTE: Triton's interpreter (CPU tests) runs no inline assembly: there the same conversion is a plain cast.
        FP8_ASM=kv_cache.is_cuda,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        PDL=pdl,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        **pdl_launch(pdl),
    )
    if num_splits > 1:
        _reduce_kernel[(num_reqs, num_q_heads)](
            part_out,
            part_lse,
            output,
            query_start_loc,
            output.stride(0),
            output.stride(1),
            num_q_heads,
            num_splits,
            HEAD_DIM=head_dim,
            BLOCK_S=triton.next_power_of_2(num_splits),
            PDL=pdl,
            **pdl_launch(pdl),
        )
