# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""int4 kernels for many rows (prefill chunks, batched decode), on the packed layout of
`engine.layers.quant.int4_layout`:
- `_int4_gemm_kernel`: a tiled GEMM. Per step it loads [GROUPS*16 words, BLOCK_N] and unpacks them at once into
  the [GROUPS*128, BLOCK_N] weight tile (the layout puts nibble t of a group's word w on channel t*16 + w, so
  shifting the words [G, 1, 16, BN] by [1, 8, 1, 1]*4 and reshaping gives the channels in order), dequantized to
  the activation dtype, and feeds one tl.dot with 128*GROUPS channels of x. Programs are ordered in GROUP_M bands
  of BLOCK_M rows so that the weight tiles of a band are read from the L2.
- `_int4_dequant_kernel`: the whole weight to the activation dtype (kernel channel order) in a scratch buffer, for
  dequantize + cuBLAS (x gathered through `perm` first for act-order layers).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _unpack_groups(words, scale, zero, GROUPS: tl.constexpr, BLOCK_N: tl.constexpr, dtype: tl.constexpr):
    """words [GROUPS*16, BLOCK_N] int32, scale/zero [GROUPS, BLOCK_N] float32 -> [GROUPS*128, BLOCK_N] in dtype."""
    shifts = (tl.arange(0, 8) * 4)[None, :, None, None]
    # NOTE: [G, 8, 16, BN] holds channel g*128 + t*16 + w; OR-ing a nibble into float 2^23's bits gives 2^23 + q
    # (no int->float conversion), and subtracting 2^23 + zero leaves q - zero exactly.
    bits = ((tl.reshape(words, (GROUPS, 1, 16, BLOCK_N)) >> shifts) & 0xF) | 0x4B000000
    magic_zero = tl.reshape(zero, (GROUPS, 1, 1, BLOCK_N)) + 8388608.0
    w = (bits.to(tl.float32, bitcast=True) - magic_zero) * tl.reshape(scale, (GROUPS, 1, 1, BLOCK_N))
    return tl.reshape(w.to(dtype), (GROUPS * 128, BLOCK_N))


@triton.jit
def _int4_gemm_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    zero_ptr,
    perm_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    HAS_PERM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUPS: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    grid_m, grid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    band = tl.program_id(0) // (GROUP_M * grid_n)
    band_m = tl.minimum(grid_m - band * GROUP_M, GROUP_M)
    in_band = tl.program_id(0) % (GROUP_M * grid_n)
    pid_m, pid_n = band * GROUP_M + in_band % band_m, in_band // band_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols_n < N
    num_groups = K // 128
    word_ids = tl.arange(0, GROUPS * 16)
    group_ids = tl.arange(0, GROUPS)
    channel_ids = tl.arange(0, GROUPS * 128)
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_xm
    w_tile = w_ptr + cols_n[None, :].to(tl.int64) * stride_wn + word_ids[:, None]
    sz_tile = cols_n[None, :] * stride_sn + group_ids[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g0 in range(0, num_groups, GROUPS):
        word_ok = (g0 * 16 + word_ids < num_groups * 16)[:, None] & col_ok[None, :]
        words = tl.load(w_tile + g0 * 16, mask=word_ok, other=0)
        sz_ok = (g0 + group_ids < num_groups)[:, None] & col_ok[None, :]
        scale = tl.load(scale_ptr + sz_tile + g0, mask=sz_ok, other=0).to(tl.float32)
        zero = tl.load(zero_ptr + sz_tile + g0, mask=sz_ok, other=0).to(tl.float32)
        channels = g0 * 128 + channel_ids
        channel_ok = channels < K
        if HAS_PERM:
            channels = tl.load(perm_ptr + channels, mask=channel_ok, other=0)
        a = tl.load(x_rows + channels[None, :], mask=row_ok[:, None] & channel_ok[None, :], other=0)
        b = _unpack_groups(words, scale, zero, GROUPS, BLOCK_N, a.dtype)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols_n, mask=col_ok, other=0).to(tl.float32)[None, :]
    out_ok = row_ok[:, None] & col_ok[None, :]
    tl.store(out_ptr + rows[:, None] * stride_om + cols_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_ok)


@triton.jit
def _int4_dequant_kernel(
    w_ptr, scale_ptr, zero_ptr, out_ptr, N, K, stride_wn, stride_sn, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr
):
    """out [N, K] (kernel channel order) = dequant(W); program (i, j): rows i*BLOCK_N.., groups j*GROUPS.."""
    cols_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    g0 = tl.program_id(1) * GROUPS
    word_ids, group_ids = tl.arange(0, GROUPS * 16), tl.arange(0, GROUPS)
    num_groups = K // 128
    col_ok = cols_n < N
    word_ok = (g0 * 16 + word_ids < num_groups * 16)[:, None] & col_ok[None, :]
    words = tl.load(w_ptr + cols_n[None, :].to(tl.int64) * stride_wn + g0 * 16 + word_ids[:, None], mask=word_ok)
    sz_ok = (g0 + group_ids < num_groups)[:, None] & col_ok[None, :]
    sz_offsets = cols_n[None, :] * stride_sn + g0 + group_ids[:, None]
    scale = tl.load(scale_ptr + sz_offsets, mask=sz_ok, other=0).to(tl.float32)
    zero = tl.load(zero_ptr + sz_offsets, mask=sz_ok, other=0).to(tl.float32)
    w = _unpack_groups(words, scale, zero, GROUPS, BLOCK_N, out_ptr.dtype.element_ty)  # [G*128, BN]
    channels = g0 * 128 + tl.arange(0, GROUPS * 128)
    out_ok = (channels < K)[:, None] & col_ok[None, :]
    tl.store(out_ptr + cols_n[None, :].to(tl.int64) * K + channels[:, None], w, mask=out_ok)
