# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""int4 x float GEMM and GEMV kernels that read the packed weights of `engine.layers.quant.int4_layout` directly.

`int4_linear(x, packed)` computes `x @ dequant(W)^T + bias` for x [M, K]:
- M <= GEMV_MAX_ROWS (batch-1 and small decode batches): `_int4_gemv_kernel`, memory-bound. Each program owns
  BLOCK_N output rows, walks K a few 128-channel groups at a time and keeps [BLOCK_M, BLOCK_N, GROUPS, 16] float32
  partial sums (one per packed word), so no reduction sits in the loop; the group scale multiplies a word's sum once.
  Many small programs (BLOCK_N of 4-16 rows) keep enough loads in flight on a 4096-row weight; the tile is autotuned
  on CUDA per (N, K, BLOCK_M), at the first call (the CUDA graph warm-up runs it outside any capture).
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

GEMV_MAX_ROWS = 8
# NOTE: the bits of float 2^23; OR-ing a nibble into its low mantissa bits gives the float 2^23 + nibble.
_MAGIC = tl.constexpr(0x4B000000)
_MAGIC_FLOAT = tl.constexpr(8388608.0)


@triton.jit
def _nibble_minus_zero(words, t: tl.constexpr, magic_zero):
    """Nibble t of every int32 word, minus its zero point, as exact float32 (magic_zero = 2^23 + zero)."""
    bits = ((words >> (4 * t)) & 0xF) | _MAGIC
    return bits.to(tl.float32, bitcast=True) - magic_zero


@triton.jit
def _int4_gemv_kernel(
    x_ptr, w_ptr, scale_ptr, zero_ptr, perm_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_sn,
    stride_om, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUPS: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = tl.arange(0, BLOCK_M)
    gs = tl.arange(0, GROUPS)
    ws = tl.arange(0, 16)
    num_groups = K // 128
    n3, g3, w3 = rows[:, None, None], gs[None, :, None], ws[None, None, :]
    m3 = ms[:, None, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N, GROUPS, 16), dtype=tl.float32)
    for g0 in range(0, num_groups, GROUPS):
        group_ok = (g0 + g3) < num_groups
        tile_ok = (n3 < N) & group_ok
        words = tl.load(w_ptr + n3.to(tl.int64) * stride_wn + (g0 + g3) * 16 + w3, mask=tile_ok, other=0)
        sz_offsets = n3 * stride_sn + g0 + g3
        scale = tl.load(scale_ptr + sz_offsets, mask=tile_ok, other=0).to(tl.float32)
        magic_zero = tl.load(zero_ptr + sz_offsets, mask=tile_ok, other=0).to(tl.float32) + _MAGIC_FLOAT
        partial = tl.zeros((BLOCK_M, BLOCK_N, GROUPS, 16), dtype=tl.float32)
        for t in tl.static_range(8):
            cols = (g0 + g3) * 128 + t * 16 + w3  # [1, GROUPS, 16] channels in kernel order
            if HAS_PERM:
                cols = tl.load(perm_ptr + cols, mask=group_ok, other=0)
            xt = tl.load(x_ptr + m3 * stride_xm + cols, mask=(m3 < M) & group_ok, other=0).to(tl.float32)
            partial += _nibble_minus_zero(words, t, magic_zero)[None, :, :, :] * xt[:, None, :, :]
        acc += partial * scale[None, :, :, :]
    out = tl.sum(tl.sum(acc, axis=3), axis=2)
    if HAS_BIAS:
        out += tl.load(bias_ptr + rows, mask=rows < N, other=0).to(tl.float32)[None, :]
    out_ok = (ms[:, None] < M) & (rows[None, :] < N)
    tl.store(out_ptr + ms[:, None] * stride_om + rows[None, :], out.to(out_ptr.dtype.element_ty), mask=out_ok)


def _prune_gemv_configs(configs, named_args, **kwargs):
    """Tiles whose float32 accumulators fit the registers, and no wider than K's groups (at least one kept)."""
    groups = named_args["K"] // GROUP_SIZE
    block_m = kwargs["BLOCK_M"]

    def fits(c: triton.Config) -> bool:
        per_thread = block_m * c.kwargs["BLOCK_N"] * c.kwargs["GROUPS"] * 16 // (c.num_warps * 32)
        return per_thread <= 32 and c.kwargs["GROUPS"] <= groups

    return [c for c in configs if fits(c)] or [min(configs, key=lambda c: c.kwargs["BLOCK_N"] * c.kwargs["GROUPS"])]


GEMV_CONFIGS = [
    triton.Config({"BLOCK_N": block_n, "GROUPS": groups}, num_warps=warps, num_stages=stages)
    for block_n, groups, warps, stages in ((4, 2, 2, 4), (4, 4, 4, 3), (8, 4, 4, 3), (4, 8, 4, 3), (16, 4, 4, 3),
                                           (8, 8, 8, 3), (16, 8, 8, 2))
]  # fmt: skip


UNTUNED_GEMV_CONFIG = {"BLOCK_N": 8, "GROUPS": 4, "num_warps": 4, "num_stages": 3}


def _bench_briefly(fn, quantiles):
    return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)


_int4_gemv_tuned = triton.autotune(
    GEMV_CONFIGS, key=["N", "K", "BLOCK_M"], prune_configs_by={"early_config_prune": _prune_gemv_configs},
    do_bench=_bench_briefly,
)(_int4_gemv_kernel)  # fmt: skip


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
    args = (x, packed.weight, packed.scale, packed.zero, packed.perm, bias, out, m, n, k, x.stride(0),
            packed.weight.stride(0), packed.scale.stride(0), out.stride(0))  # fmt: skip
    flags = {"HAS_PERM": packed.perm is not None, "HAS_BIAS": bias is not None}
    if m <= GEMV_MAX_ROWS:
        block_m = triton.next_power_of_2(m)
        if gemv_config is None and x.device.type != "cuda":
            gemv_config = UNTUNED_GEMV_CONFIG
        if gemv_config is None:
            _int4_gemv_tuned[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](*args, **flags, BLOCK_M=block_m)
        else:
            grid = (triton.cdiv(n, gemv_config["BLOCK_N"]),)
            _int4_gemv_kernel[grid](*args, **flags, BLOCK_M=block_m, **gemv_config)
        return out
    config = gemm_config(m)
    grid = (triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"]),)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    _int4_gemm_kernel[grid](*args, **flags, DOT_PRECISION=precision, **config)
    return out
