# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""int4 x float GEMM and GEMV kernels that read the packed weights of `engine.layers.quant.int4_layout` directly.

`int4_linear(x, packed)` computes `x @ dequant(W)^T + bias` for x [M, K]:
- M <= GEMV_MAX_ROWS (batch-1 and small decode batches): `_int4_gemv_kernel`, memory-bound, one activation row
  per program column. Each program owns BLOCK_N output rows, walks K GROUPS 128-channel groups at a time (loading
  the next tile before using the current one, so two are in flight) and keeps [BLOCK_N, GROUPS, 16] float32 partial
  sums (one per packed word), so no reduction sits in the loop; the group scale multiplies a word's sum once.
  The tile is autotuned on CUDA per (N, K) and row count (1, 2, 4) at the first call (the CUDA graph warm-up runs
  it outside any capture).
- larger M (prefill chunks, batched decode): `_int4_gemm_kernel`, a tiled GEMM that dequantizes each [16 words,
  BLOCK_N] weight tile to the activation dtype, nibble by nibble, and feeds it to `tl.dot` with the 16 activation
  columns that nibble holds (the layout puts nibble t of a group's 16 words on channels t*16 .. t*16+15).
Both turn a nibble q into a float without an int->float conversion: the bits `q | 0x4B000000` are the float 2^23 + q,
and subtracting 2^23 + zero gives q - zero exactly. Act-order layers gather their activation columns through `perm`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.layers.quant.int4_layout import GROUP_SIZE, WORDS_PER_GROUP, PackedInt4

GEMV_MAX_ROWS = 4
# NOTE: the bits of float 2^23; OR-ing a nibble into its low mantissa bits gives the float 2^23 + nibble.
_MAGIC = tl.constexpr(0x4B000000)
_MAGIC_FLOAT = tl.constexpr(8388608.0)


@triton.jit
def _nibble_minus_zero(words, t: tl.constexpr, magic_zero):
    """Nibble t of every int32 word, minus its zero point, as exact float32 (magic_zero = 2^23 + zero)."""
    bits = ((words >> (4 * t)) & 0xF) | _MAGIC
    return bits.to(tl.float32, bitcast=True) - magic_zero


@triton.jit
def _nibble_in_place(words, p: tl.constexpr, zero, x):
    """(nibble p of each word - zero) * x, for p <= 4: (words & 0xF << 4p) | 2^23's bits is the float
    2^23 + q * 16^p, minus 2^23 + zero * 16^p leaves (q - zero) * 16^p exactly; x * 16^-p (exact) restores the
    product. One LOP3, one FADD and one FFMA per weight (x's scaling is shared by the rows a thread holds)."""
    bits = (words & (0xF << (4 * p))) | _MAGIC
    place = 1 << (4 * p)
    return (bits.to(tl.float32, bitcast=True) - (_MAGIC_FLOAT + zero * place)) * (x * (1.0 / place))


@triton.jit
def _gemv_tile(w_ptr, scale_ptr, zero_ptr, n3, g3, w3, g0, N, num_groups, stride_wn, stride_sn):
    """The words [BLOCK_N, GROUPS, 16], scales and zeros [BLOCK_N, GROUPS, 1] (float32) of the groups from g0."""
    tile_ok = (n3 < N) & ((g0 + g3) < num_groups)
    words = tl.load(w_ptr + n3.to(tl.int64) * stride_wn + (g0 + g3) * 16 + w3, mask=tile_ok, other=0)
    sz_offsets = n3 * stride_sn + g0 + g3
    scale = tl.load(scale_ptr + sz_offsets, mask=tile_ok, other=0).to(tl.float32)
    zero = tl.load(zero_ptr + sz_offsets, mask=tile_ok, other=0).to(tl.float32)
    return words, scale, zero


@triton.jit
def _int4_gemv_kernel(
    x_ptr, w_ptr, scale_ptr, zero_ptr, perm_ptr, bias_ptr, out_ptr, N, K, stride_xm, stride_wn, stride_sn, stride_om,
    HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    x_row = x_ptr + tl.program_id(1) * stride_xm
    num_groups = K // 128
    n3 = rows[:, None, None]
    g3 = tl.arange(0, GROUPS)[None, :, None]
    w3 = tl.arange(0, 16)[None, None, :]
    acc = tl.zeros((BLOCK_N, GROUPS, 16), dtype=tl.float32)
    # NOTE: each tile is loaded one iteration ahead of its use, so two tiles per program are in flight.
    next_tile = _gemv_tile(w_ptr, scale_ptr, zero_ptr, n3, g3, w3, 0, N, num_groups, stride_wn, stride_sn)
    for g0 in range(0, num_groups, GROUPS):
        words, scale, zero = next_tile
        next_tile = _gemv_tile(w_ptr, scale_ptr, zero_ptr, n3, g3, w3, g0 + GROUPS, N, num_groups, stride_wn, stride_sn)
        group_ok = (g0 + g3) < num_groups
        high_words = words >> 12  # nibbles 5-7 at places 2-4, below the float's exponent bits
        partial = tl.zeros((BLOCK_N, GROUPS, 16), dtype=tl.float32)
        for t in tl.static_range(8):
            cols = (g0 + g3) * 128 + t * 16 + w3  # [1, GROUPS, 16] channels in kernel order
            if HAS_PERM:
                cols = tl.load(perm_ptr + cols, mask=group_ok, other=0)
            xt = tl.load(x_row + cols, mask=group_ok, other=0).to(tl.float32)
            if t < 5:
                partial += _nibble_in_place(words, t, zero, xt)
            else:
                partial += _nibble_in_place(high_words, t - 3, zero, xt)
        acc += partial * scale
    out = tl.sum(tl.sum(acc, axis=2), axis=1)
    if HAS_BIAS:
        out += tl.load(bias_ptr + rows, mask=rows < N, other=0).to(tl.float32)
    out_row = out_ptr + tl.program_id(1) * stride_om
    tl.store(out_row + rows, out.to(out_ptr.dtype.element_ty), mask=rows < N)


def _prune_gemv_configs(configs, named_args, **kwargs):
    """Tiles no wider than K's groups (at least one kept)."""
    groups = named_args["K"] // GROUP_SIZE
    fitting = [c for c in configs if c.kwargs["GROUPS"] <= groups]
    return fitting or [min(configs, key=lambda c: c.kwargs["GROUPS"])]


# NOTE: tiles whose words Triton lays out 4 per thread (one 16-byte load) with 1-2 rows per thread: larger ones
# (more elements per thread) get layouts that convert through shared memory inside the loop (checked on the sm_90
# SASS). GROUPS 8 puts the most bytes in flight on 4096-row weights; the autotuner picks per shape.
GEMV_CONFIGS = [
    triton.Config({"BLOCK_N": block_n, "GROUPS": groups}, num_warps=warps, num_stages=2)
    for block_n, groups, warps in ((8, 2, 4), (16, 2, 4), (32, 2, 4), (8, 4, 4), (16, 4, 4), (8, 8, 8), (16, 8, 8))
]


UNTUNED_GEMV_CONFIG = {"BLOCK_N": 8, "GROUPS": 4, "num_warps": 4, "num_stages": 2}


def _bench_briefly(fn, quantiles):
    return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)


# NOTE: one autotuner per row count (1, 2, 4): a batch-1 step's best tile need not be a 4-row step's.
_GEMV_TUNED = {
    rows: triton.autotune(
        GEMV_CONFIGS, key=["N", "K"], prune_configs_by={"early_config_prune": _prune_gemv_configs},
        do_bench=_bench_briefly,
    )(_int4_gemv_kernel)
    for rows in (1, 2, 4)
}  # fmt: skip


@triton.jit
def _int4_gemm_kernel(
    x_ptr, w_ptr, scale_ptr, zero_ptr, perm_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_sn,
    stride_om, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    grid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tl.program_id(0) // grid_n, tl.program_id(0) % grid_n
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ws = tl.arange(0, 16)
    row_ok, col_ok = rows < M, cols_n < N
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_xm
    w_cols = w_ptr + cols_n[None, :].to(tl.int64) * stride_wn + ws[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g in range(0, K // 128):
        words = tl.load(w_cols + g * 16, mask=col_ok[None, :], other=0)  # [16, BLOCK_N]
        scale = tl.load(scale_ptr + cols_n * stride_sn + g, mask=col_ok, other=0).to(tl.float32)[None, :]
        zero = tl.load(zero_ptr + cols_n * stride_sn + g, mask=col_ok, other=0).to(tl.float32)[None, :]
        for t in tl.static_range(8):
            channels = g * 128 + t * 16 + ws
            if HAS_PERM:
                channels = tl.load(perm_ptr + channels)
            a = tl.load(x_rows + channels[None, :], mask=row_ok[:, None], other=0)
            b = (_nibble_minus_zero(words, t, zero + _MAGIC_FLOAT) * scale).to(a.dtype)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols_n, mask=col_ok, other=0).to(tl.float32)[None, :]
    out_ok = row_ok[:, None] & col_ok[None, :]
    tl.store(out_ptr + rows[:, None] * stride_om + cols_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_ok)


def gemm_config(num_rows: int) -> dict[str, int]:
    """The GEMM tile for M rows: narrow tiles for decode batches (more programs to stream the weight), wide for
    prefill chunks (fewer re-reads of each dequantized weight tile)."""
    if num_rows <= 16:
        return {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 4}
    if num_rows <= 64:
        return {"BLOCK_M": 32 if num_rows <= 32 else 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 4}
    return {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3}


def _check(x: torch.Tensor, packed: PackedInt4, bias: torch.Tensor | None) -> None:
    n, words = packed.weight.shape
    k = words * 8
    if x.dim() != 2 or x.shape[1] != k or x.stride(1) != 1:
        raise ValueError(f"x {tuple(x.shape)} (strides {x.stride()}) is not [M, {k}] with unit column stride")
    if packed.weight.dtype != torch.int32 or packed.weight.stride(1) != 1 or words % WORDS_PER_GROUP:
        raise ValueError(f"weight {packed.weight.dtype}{tuple(packed.weight.shape)} is not packed int4 [N, K/8]")
    groups = k // GROUP_SIZE
    for name, t in (("scale", packed.scale), ("zero", packed.zero)):
        if t.shape != (n, groups) or t.stride() != packed.scale.stride() or t.stride(1) != 1:
            raise ValueError(f"{name} {tuple(t.shape)} (strides {t.stride()}) is not [{n}, {groups}] like scale")
    if packed.perm is not None and (packed.perm.shape != (k,) or packed.perm.dtype != torch.int32):
        raise ValueError(f"perm {packed.perm.dtype}{tuple(packed.perm.shape)} is not int32 [{k}]")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias {tuple(bias.shape)} is not [{n}]")


def int4_linear(
    x: torch.Tensor, packed: PackedInt4, bias: torch.Tensor | None, gemv_config: dict[str, int] | None = None
) -> torch.Tensor:
    """x [M, K] @ dequant(packed)^T + bias -> [M, N] in x's dtype. `gemv_config` (BLOCK_N, GROUPS, num_warps,
    num_stages) fixes the GEMV tile instead of autotuning it (tests); off CUDA (Triton's interpreter) the GEMV runs
    UNTUNED_GEMV_CONFIG."""
    _check(x, packed, bias)
    m, k = x.shape
    n = packed.weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    tensors = (x, packed.weight, packed.scale, packed.zero, packed.perm, bias, out)
    strides = (x.stride(0), packed.weight.stride(0), packed.scale.stride(0), out.stride(0))
    flags = {"HAS_PERM": packed.perm is not None, "HAS_BIAS": bias is not None}
    if m <= GEMV_MAX_ROWS:
        if gemv_config is None and x.device.type != "cuda":
            gemv_config = UNTUNED_GEMV_CONFIG
        if gemv_config is None:
            tuned = _GEMV_TUNED[triton.next_power_of_2(m)]
            tuned[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), m)](*tensors, n, k, *strides, **flags)
        else:
            gemv_grid = (triton.cdiv(n, gemv_config["BLOCK_N"]), m)
            _int4_gemv_kernel[gemv_grid](*tensors, n, k, *strides, **flags, **gemv_config)
        return out
    config = gemm_config(m)
    grid = (triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"]),)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    _int4_gemm_kernel[grid](*tensors, m, n, k, *strides, **flags, DOT_PRECISION=precision, **config)
    return out
