# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""The FP8 linear layer on CUDA: `y = x @ (w_fp8 * weight_scale)^T + bias`.

- One row (batch-1 decode): a Triton GEMV modelled on `engine.layers.triton_gemv`. It streams the fp8 weight
  (half the bytes of bf16) with the bf16/fp16 activation row kept as it is (no activation quantization: at one
  row the multiply costs nothing and skipping it saves an error), sums in float32 and applies the per-channel scale
  once per output. Each program owns BLOCK_N output rows and walks K in BLOCK_K columns. Gated
  (`fp8_linear_silu_and_mul`), the gate_up projection runs with SwiGLU in the same launch
  (engine.layers.triton_gated).
- More rows: x quantized per token by one Triton kernel (`quantize_rows`: `quantize_fp8_rows`' rule; in torch
  that rule is ~7 passes over x, a few ms per 2k-token prefill of an 8B model) and `torch._scaled_mm` with rowwise
  scales: a [M, K] row-major fp8, b = w^T [K, N] column-major (w [N, K] contiguous, transposed as a view),
  scale_a [M, 1] and scale_b [1, N] float32, out bf16 (rowwise scaling takes no other output dtype), fast
  accumulation (as FP8 inference kernels use: the products are summed in fp32 in chunks).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from engine.layers.pdl import pdl_launch, pdl_supported
from engine.layers.quant.fp8 import FP8_DTYPE, FP8_MAX, MIN_SCALE
from engine.layers.triton_activation import silu_and_mul
from engine.layers.triton_gated import store_rows, tile_rows

_BLOCK_KS = (1024, 512, 256, 128, 64)
QUANT_BLOCK = 1024
ONE_PASS_MAX = 16384


@dataclass(slots=True, frozen=True)
class Fp8GemvTiles:
    """Launch shape of the GEMV: BLOCK_N output rows per program, K walked BLOCK_K columns at a time, the K loop
    unrolled `unroll` times (so that the loads of several steps can be in flight before their products); `pdl`: a
    programmatic dependent launch (it may start before the previous kernel in the stream has finished: its first
    weight step loads meanwhile, x and the output wait for that kernel)."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4
    unroll: int = 1
    pdl: bool = False


@triton.jit
def _fp8_gemv_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    K,
    stride_wn,
    half_n,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    UNROLL: tl.constexpr,
    VEC: tl.constexpr,
    PDL: tl.constexpr,
    GATED: tl.constexpr,
):
    rows = tile_rows(BLOCK_N, half_n, GATED)
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    # NOTE: the weight read VEC bytes per thread (x's values per 16-byte load) and x as a [BLOCK_N, BLOCK_K] tile
    # (its row again for every weight row, from L1) give both loads one register layout. Else (16-byte fp8 loads
    # beside a 1-D x, or VEC = 16 with bf16 x: 32 bytes of x per thread) each step converted a layout through
    # shared memory: 2-4 barriers per step in the PTX.
    w_cols = tl.max_contiguous(tl.multiple_of(cols, VEC), VEC)
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_wn + w_cols[None, :]
    x_ptrs = x_ptr + cols[None, :] + 0 * rows[:, None]
    if PDL:
        # NOTE: the first step's weights (no kernel writes them) load before the wait for the previous kernel;
        # signalled at once, a PDL successor may start too (engine.layers.pdl).
        tl.extra.cuda.gdc_launch_dependents()
        w_first = tl.load(w_ptrs)
        tl.extra.cuda.gdc_wait()
        acc += w_first.to(tl.float32) * tl.load(x_ptrs).to(tl.float32)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    for _ in tl.range(PDL * BLOCK_K, K, BLOCK_K, loop_unroll_factor=UNROLL):
        acc += tl.load(w_ptrs).to(tl.float32) * tl.load(x_ptrs).to(tl.float32)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    out = tl.sum(acc, axis=1) * tl.load(scale_ptr + rows)
    if HAS_BIAS:
        out += tl.load(bias_ptr + rows).to(tl.float32)
    store_rows(out_ptr, rows, out, BLOCK_N, GATED)


@triton.jit
def _quantize_rows_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    K,
    stride_x,
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    BLOCK: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    # One row: its absmax, then the row divided by absmax / FP8_MAX, saturated, rounded to fp8. ONE_PASS (the row
    # fits one BLOCK): x is read once and kept in registers; else it is read twice, BLOCK columns at a time.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_x
    if ONE_PASS:
        x = tl.load(x_row + cols, mask=cols < K, other=0.0).to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), axis=0) / FP8_MAX, MIN_SCALE)
        q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
        tl.store(q_ptr + row * K + cols, q.to(q_ptr.dtype.element_ty), mask=cols < K)
    else:
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, K, BLOCK):
            x = tl.load(x_row + start + cols, mask=start + cols < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        scale = tl.maximum(tl.max(amax, axis=0) / FP8_MAX, MIN_SCALE)
        for start in range(0, K, BLOCK):
            mask = start + cols < K
            x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
            tl.store(q_ptr + row * K + start + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (unit column stride) -> (float8_e4m3fn [M, K] contiguous, float32 scale [M]): `quantize_fp8_rows`
    in one kernel."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x {tuple(x.shape)} with strides {x.stride()} is not [M, K] with a unit column stride")
    m, k = x.shape
    q = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(m, dtype=torch.float32, device=x.device)
    # NOTE: a row up to ONE_PASS_MAX wide is read once (the prefill chunk's x is twice the L2 for `down`'s input,
    # so a second pass re-reads HBM), at most 32 values per thread.
    one_pass = k <= ONE_PASS_MAX
    block = triton.next_power_of_2(k) if one_pass else QUANT_BLOCK
    if m:
        _quantize_rows_kernel[(m,)](
            x,
            q,
            scale,
            k,
            x.stride(0),
            FP8_MAX=FP8_MAX,
            MIN_SCALE=MIN_SCALE,
            BLOCK=block,
            ONE_PASS=one_pass,
            num_warps=min(16, max(4, block // 512)),
        )
    return q, scale


TILES_PATH = Path(__file__).with_name("fp8_gemv_tiles.json")


def load_tiles(path: Path) -> dict[tuple[int, int], Fp8GemvTiles]:
    """A tile table: {"NxK": {Fp8GemvTiles' fields}}; a missing file is an empty table."""
    try:
        table = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return {tuple(map(int, shape.split("x"))): Fp8GemvTiles(**fields) for shape, fields in table.items()}  # type: ignore[misc]


def tiles_json(table: dict[tuple[int, int], Fp8GemvTiles]) -> str:
    """`load_tiles`' format."""
    return json.dumps({f"{n}x{k}": asdict(tiles) for (n, k), tiles in table.items()}, indent=1)


# NOTE: the fastest tiles per weight [N, K] of the Qwen3-8B projections, written by engine/layers/tune_fp8_gemv.py on
# the GPU (weights rotating past the L2, CUDA-graph replays); other shapes take `default_tiles`' rule.
TUNED_TILES = load_tiles(TILES_PATH)


def default_tiles(n: int, k: int) -> Fp8GemvTiles | None:
    """The tiles for a weight [n, k] (None: no whole tiling): `TUNED_TILES`' entry, else 8 rows (4 above
    n = 8192) and the widest K step dividing k (the bf16 GEMV's bytes per tile)."""
    if (n, k) in TUNED_TILES:
        return TUNED_TILES[(n, k)]
    block_n = 8 if n <= 8192 else 4
    block_k = next((b for b in _BLOCK_KS if k % b == 0), None)
    return None if block_k is None or n % block_n else Fp8GemvTiles(block_n, block_k)


def fp8_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    tiles: Fp8GemvTiles | None = None,
    gated: bool = False,
) -> torch.Tensor:
    """x [1, K] (bf16/fp16/fp32) @ (weight fp8 [N, K] * weight_scale float32 [N])^T + bias -> [1, N] in x's dtype,
    or (gated: N = 2 * I, gate rows then up rows) silu(gate) * up [1, I]. `tiles` (default: `default_tiles`) must
    divide N and K."""
    n, k = weight.shape
    tiles = tiles or default_tiles(n, k)
    if tiles is None or n % tiles.block_n or k % tiles.block_k:
        raise ValueError(f"fp8 weight {tuple(weight.shape)} is not a whole number of {tiles} tiles")
    if x.shape != (1, k) or weight.dtype != FP8_DTYPE or weight.stride(1) != 1:
        raise ValueError(f"x {x.dtype}{tuple(x.shape)} does not fit fp8 weight {weight.dtype}{tuple(weight.stride())}")
    if weight_scale.shape != (n,) or weight_scale.dtype != torch.float32 or (bias is not None and bias.shape != (n,)):
        raise ValueError(f"weight_scale {weight_scale.dtype}{tuple(weight_scale.shape)} or bias is not [{n}]")
    x = x.contiguous()
    if gated and (n % 2 or tiles.block_n % 2):
        raise ValueError(f"a gated fp8 GEMV needs an even weight height and tile, got {n} rows in {tiles} tiles")
    out = torch.empty((1, n // 2 if gated else n), dtype=x.dtype, device=x.device)
    pdl = tiles.pdl and pdl_supported(x.device)
    _fp8_gemv_kernel[(n // tiles.block_n,)](
        x,
        weight,
        weight_scale,
        bias,
        out,
        k,
        weight.stride(0),
        n // 2,
        HAS_BIAS=bias is not None,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        UNROLL=tiles.unroll,
        VEC=16 // x.element_size(),
        PDL=pdl,
        GATED=gated,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        **pdl_launch(pdl),
    )
    return out


def gemv_supported(weight: torch.Tensor) -> bool:
    return weight.stride(1) == 1 and default_tiles(*weight.shape) is not None


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [T, K] -> [T, N]: the GEMV at T = 1, `torch._scaled_mm` with per-token x scales otherwise."""
    if x.shape[0] == 1 and gemv_supported(weight):
        return fp8_gemv(x, weight, weight_scale, bias)
    xq, x_scale = quantize_rows(x)
    out = torch._scaled_mm(
        xq,
        weight.t(),
        scale_a=x_scale[:, None],
        scale_b=weight_scale[None, :],
        out_dtype=torch.bfloat16,
        use_fast_accum=True,
    )
    out = out.to(x.dtype)
    return out if bias is None else out + bias


def fp8_linear_silu_and_mul(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`silu_and_mul(fp8_linear(...))` for the gate_up projection (gate rows then up rows): one launch at T = 1,
    bit for bit the same."""
    tiles = default_tiles(*weight.shape)
    if x.shape[0] == 1 and gemv_supported(weight) and tiles is not None and tiles.block_n % 2 == 0:
        return fp8_gemv(x, weight, weight_scale, bias, tiles, gated=True)
    return silu_and_mul(fp8_linear(x, weight, weight_scale, bias))
