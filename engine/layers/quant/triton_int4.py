# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""int4 x float linear layers on the packed weights of `engine.layers.quant.int4_layout`.

`int4_linear(x, packed)` computes `x @ dequant(W)^T + bias` for x [M, K] with the kernel and tile that
`engine.layers.quant.int4_tuning` names for (N, K, M's bucket) (the GPU sweep's table, else a heuristic):
- "gemv" (batch-1 and small decode batches): `_int4_gemv_kernel`, memory-bound, one activation row per program
  column. Each program owns BLOCK_N output rows and one of SPLIT_K ranges of K's groups, walks it GROUPS
  128-channel groups at a time (loading the next tile before using the current one, so two are in flight) and keeps
  [BLOCK_N, GROUPS, 16] float32 partial sums (one per packed word), so no reduction sits in the loop; the group
  scale multiplies a word's sum once. With SPLIT_K > 1 (more programs than output tiles, for weights with few rows)
  the programs write float32 partial sums that `_splitk_reduce_kernel` adds up (atomic-free, deterministic).
  A nibble becomes a float without an int->float conversion: the bits `(word & 0xF << 4p) | 0x4B000000` are the
  float 2^23 + q*16^p, so a weight costs one LOP3, one FADD and one FFMA.
  With HALF2 (bf16/fp16 activations; a tuning knob) two nibbles become two half-precision values per 32-bit op
  instead, and their products are summed in packed pairs (engine.layers.quant.triton_int4_half2): per 16 weights
  6 shifts, 8 LOP3, 17 packed FMAs and one widening to float32, against 48 float ops.
  With PDL (a tuning knob; CUDA) the kernel is launched as a programmatic dependent launch: it may start before
  the previous kernel in the stream has finished, loads its first weight tile, then waits for that kernel
  (`griddepcontrol.wait`) before it reads x or writes anything.
  Gated (`int4_linear_silu_and_mul`, a config without split-K), the gate_up projection runs with SwiGLU in the
  same launch (engine.layers.triton_gated).
- "gemm" / "dequant" (more rows): engine.layers.quant.triton_int4_gemm.
Act-order layers gather their activation columns through `perm`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.layers.pdl import pdl_launch, pdl_supported
from engine.layers.quant.int4_layout import GROUP_SIZE, WORDS_PER_GROUP, PackedInt4
from engine.layers.quant.int4_tuning import Int4Config, config_for
from engine.layers.quant.triton_int4_gemm import _int4_dequant_kernel, _int4_gemm_kernel
from engine.layers.quant.triton_int4_half2 import HALF_MAGIC, _half2_word_sums, _x_at
from engine.layers.triton_activation import silu_and_mul
from engine.layers.triton_gated import store_rows, tile_rows

# NOTE: the bits of float 2^23; OR-ing a nibble into its low mantissa bits gives the float 2^23 + nibble.
_MAGIC = tl.constexpr(0x4B000000)
_MAGIC_FLOAT = tl.constexpr(8388608.0)
_REDUCE_BLOCK = 1024


@triton.jit
def _nibble_in_place(words, p: tl.constexpr, zero, x):
    """(nibble p of each word - zero) * x, for p <= 4: (words & 0xF << 4p) | 2^23's bits is the float
    2^23 + q * 16^p, minus 2^23 + zero * 16^p leaves (q - zero) * 16^p exactly; x * 16^-p (exact) restores the
    product. One LOP3, one FADD and one FFMA per weight (x's scaling is shared by the rows a thread holds)."""
    bits = (words & (0xF << (4 * p))) | _MAGIC
    place = 1 << (4 * p)
    return (bits.to(tl.float32, bitcast=True) - (_MAGIC_FLOAT + zero * place)) * (x * (1.0 / place))


@triton.jit
def _gemv_tile(w_ptr, scale_ptr, zero_ptr, n3, g3, w3, g0, N, g_end, stride_wn, stride_sn):
    """The words [BLOCK_N, GROUPS, 16], scales (float32) and zeros (uint8) [BLOCK_N, GROUPS, 1] from group g0."""
    tile_ok = (n3 < N) & ((g0 + g3) < g_end)
    words = tl.load(w_ptr + n3.to(tl.int64) * stride_wn + (g0 + g3) * 16 + w3, mask=tile_ok, other=0)
    sz_offsets = n3 * stride_sn + g0 + g3
    scale = tl.load(scale_ptr + sz_offsets, mask=tile_ok, other=0).to(tl.float32)
    zero = tl.load(zero_ptr + sz_offsets, mask=tile_ok, other=0)
    return words, scale, zero


@triton.jit
def _float_word_sums(words, zero, x_row, perm_ptr, g0, g3, w3, group_ok, HAS_PERM: tl.constexpr, EVEN: tl.constexpr):
    """Each word's sum of (q - zero) * x over its 8 nibbles, in float32 (the 2^23 trick of `_nibble_in_place`)."""
    zero = zero.to(tl.float32)
    high_words = words >> 12  # nibbles 5-7 at places 2-4, below the float's exponent bits
    partial = tl.zeros(words.shape, dtype=tl.float32)
    for t in tl.static_range(8):
        xt = _x_at(x_row, perm_ptr, (g0 + g3) * 128 + t * 16 + w3, group_ok, HAS_PERM, EVEN).to(tl.float32)
        if t < 5:
            partial += _nibble_in_place(words, t, zero, xt)
        else:
            partial += _nibble_in_place(high_words, t - 3, zero, xt)
    return partial


@triton.jit
def _int4_gemv_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    zero_ptr,
    perm_ptr,
    bias_ptr,
    out_ptr,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    groups_per_split,
    half_n,
    HAS_PERM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUPS: tl.constexpr,
    PARTIAL: tl.constexpr,
    HALF2: tl.constexpr,
    MAGIC: tl.constexpr,
    ASM: tl.constexpr,
    EVEN: tl.constexpr,
    PDL: tl.constexpr,
    GATED: tl.constexpr,
):
    rows = tile_rows(BLOCK_N, half_n, GATED)
    x_row = x_ptr + tl.program_id(1) * stride_xm
    g_begin = tl.program_id(2) * groups_per_split
    g_end = tl.minimum(g_begin + groups_per_split, K // 128)
    n3 = rows[:, None, None]
    g3 = tl.arange(0, GROUPS)[None, :, None]
    w3 = tl.arange(0, 16)[None, None, :]
    acc = tl.zeros((BLOCK_N, GROUPS, 16 // (1 + HALF2)), dtype=tl.float32)  # HALF2: a sum per two words
    # NOTE: each tile is loaded one iteration ahead of its use, so two tiles per program are in flight.
    next_tile = _gemv_tile(w_ptr, scale_ptr, zero_ptr, n3, g3, w3, g_begin, N, g_end, stride_wn, stride_sn)
    if PDL:
        # NOTE: launched early (engine.layers.pdl): the first tile's weights (no kernel writes them) stream in while
        # the previous kernel finishes; x and the output wait for it. Signalled at once, a PDL successor (the next
        # GEMV in the sweep's timing graph, as this one after RMSNorm / SiLU-mul in a decoder layer) may start too.
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    for g0 in range(g_begin, g_end, GROUPS):
        words, scale, zero = next_tile
        next_tile = _gemv_tile(w_ptr, scale_ptr, zero_ptr, n3, g3, w3, g0 + GROUPS, N, g_end, stride_wn, stride_sn)
        group_ok = (g0 + g3) < g_end
        if HALF2:
            partial = _half2_word_sums(words, zero, x_row, perm_ptr, g0, g3, w3, group_ok, HAS_PERM, EVEN, MAGIC, ASM)
        else:
            partial = _float_word_sums(words, zero, x_row, perm_ptr, g0, g3, w3, group_ok, HAS_PERM, EVEN)
        acc += partial * scale
    out = tl.sum(tl.sum(acc, axis=2), axis=1)
    if PARTIAL:
        # NOTE: split-K: float32 partial sums [SPLIT, M, N], summed (with the bias) by _splitk_reduce_kernel.
        part_row = out_ptr + (tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)).to(tl.int64) * N
        tl.store(part_row + rows, out, mask=rows < N)
    else:
        if HAS_BIAS:
            out += tl.load(bias_ptr + rows, mask=rows < N, other=0).to(tl.float32)
        out_row = out_ptr + tl.program_id(1) * stride_om
        if GATED:  # NOTE: whole tiles only (the launcher's check)
            store_rows(out_row, rows, out, BLOCK_N, GATED)
        else:
            tl.store(out_row + rows, out.to(out_ptr.dtype.element_ty), mask=rows < N)


@triton.jit
def _splitk_reduce_kernel(
    part_ptr, bias_ptr, out_ptr, N, stride_om, num_splits, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr
):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    num_rows = tl.num_programs(1)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in range(0, num_splits):
        acc += tl.load(part_ptr + (split * num_rows + tl.program_id(1)).to(tl.int64) * N + cols, mask=ok, other=0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=ok, other=0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(1) * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


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


def _gemv(x, packed, bias, out, meta: dict[str, int], gated: bool = False) -> None:
    """`gated`: out [M, N / 2] takes silu(gate) * up (one split, whole tiles: `_gates_in_launch`)."""
    m, k = x.shape
    n = packed.weight.shape[0]
    meta = dict(meta)
    half2 = bool(meta.pop("HALF2", 0)) and x.dtype in HALF_MAGIC
    pdl = bool(meta.pop("PDL", 0)) and pdl_supported(x.device)
    num_groups = k // GROUP_SIZE
    groups_per_split = _groups_per_split(num_groups, meta.pop("SPLIT_K", 1), meta["GROUPS"])
    num_splits = triton.cdiv(num_groups, groups_per_split)
    partial = num_splits > 1
    target = torch.empty((num_splits, m, n), dtype=torch.float32, device=x.device) if partial else out
    grid = (triton.cdiv(n, meta["BLOCK_N"]), m, num_splits)
    _int4_gemv_kernel[grid](
        x,
        packed.weight,
        packed.scale,
        packed.zero,
        packed.perm,
        bias,
        target,
        n,
        k,
        x.stride(0),
        packed.weight.stride(0),
        packed.scale.stride(0),
        out.stride(0),
        groups_per_split,
        n // 2,
        HAS_PERM=packed.perm is not None,
        HAS_BIAS=bias is not None,
        PARTIAL=partial,
        HALF2=half2,
        EVEN=num_groups % groups_per_split == 0,
        MAGIC=HALF_MAGIC.get(x.dtype, 0),
        ASM=x.is_cuda,
        PDL=pdl,
        GATED=gated,
        **meta,
        **pdl_launch(pdl),
    )
    if partial:
        reduce_grid = (triton.cdiv(n, _REDUCE_BLOCK), m)
        _splitk_reduce_kernel[reduce_grid](
            target, bias, out, n, out.stride(0), num_splits, HAS_BIAS=bias is not None, BLOCK=_REDUCE_BLOCK
        )


def _groups_per_split(num_groups: int, split_k: int, groups: int) -> int:
    """K's groups per program of a GEMV split `split_k` ways, a whole number of GROUPS-group steps."""
    return triton.cdiv(triton.cdiv(num_groups, split_k), groups) * groups


def _gates_in_launch(n: int, k: int, config: Int4Config) -> bool:
    """Whether `config` runs the gated GEMV: the GEMV kernel, one split (a split-K's partial sums would need the gate
    in their reduce), whole tiles of an even BLOCK_N."""
    if config.kernel != "gemv":
        return False
    meta, num_groups = config.meta, k // GROUP_SIZE
    one_split = _groups_per_split(num_groups, meta.get("SPLIT_K", 1), meta["GROUPS"]) >= num_groups
    return one_split and meta["BLOCK_N"] % 2 == 0 and n % meta["BLOCK_N"] == 0


def _gemm(x, packed, bias, out, meta: dict[str, int]) -> None:
    m, k = x.shape
    n = packed.weight.shape[0]
    grid = (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
    _int4_gemm_kernel[grid](
        x,
        packed.weight,
        packed.scale,
        packed.zero,
        packed.perm,
        bias,
        out,
        m,
        n,
        k,
        x.stride(0),
        packed.weight.stride(0),
        packed.scale.stride(0),
        out.stride(0),
        HAS_PERM=packed.perm is not None,
        HAS_BIAS=bias is not None,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        **meta,
    )


def _dequant(x, packed, bias, out, meta: dict[str, int]) -> None:
    """The weight dequantized into a scratch buffer (kernel channel order), then cuBLAS on x's gathered columns."""
    n, k = packed.weight.shape[0], x.shape[1]
    weight = torch.empty((n, k), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(k // GROUP_SIZE, meta["GROUPS"]))
    _int4_dequant_kernel[grid](
        packed.weight, packed.scale, packed.zero, weight, n, k, packed.weight.stride(0), packed.scale.stride(0), **meta
    )
    x_kernel_order = x if packed.perm is None else x.index_select(1, packed.perm)
    if bias is None:
        torch.mm(x_kernel_order, weight.T, out=out)
    else:
        torch.addmm(bias, x_kernel_order, weight.T, out=out)


_LAUNCHERS = {"gemv": _gemv, "gemm": _gemm, "dequant": _dequant}


def int4_linear(
    x: torch.Tensor, packed: PackedInt4, bias: torch.Tensor | None, config: Int4Config | None = None
) -> torch.Tensor:
    """x [M, K] @ dequant(packed)^T + bias -> [M, N] in x's dtype, on `config`'s kernel (default: the tuned table's
    entry for this shape and M, else the heuristic: `engine.layers.quant.int4_tuning.config_for`)."""
    _check(x, packed, bias)
    m, k = x.shape
    n = packed.weight.shape[0]
    config = config or config_for(n, k, m)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m:
        _LAUNCHERS[config.kernel](x, packed, bias, out, config.meta)
    return out


def int4_linear_silu_and_mul(
    x: torch.Tensor, packed: PackedInt4, bias: torch.Tensor | None, config: Int4Config | None = None
) -> torch.Tensor:
    """`silu_and_mul(int4_linear(x, packed, bias, config))` for the gate_up projection (gate rows then up rows):
    one launch where the config is a one-split GEMV over whole tiles (`_gates_in_launch`), bit for bit the same."""
    m, k = x.shape[0], x.shape[-1]
    n = packed.weight.shape[0]
    config = config or config_for(n, k, m)
    if not m or n % 2 or not _gates_in_launch(n, k, config):
        return silu_and_mul(int4_linear(x, packed, bias, config))  # NOTE: int4_linear checks the arguments
    _check(x, packed, bias)
    out = torch.empty((m, n // 2), dtype=x.dtype, device=x.device)
    _gemv(x, packed, bias, out, config.meta, gated=True)
    return out
