"""FP8 kernel checks, run on the GPU and (small cases) in Triton's interpreter.

- the FP8 GEMV and `fp8_linear` against a float64 product of the dequantized weight, and the per-token activation
  quantizer against `quantize_fp8_rows` (its fp8 values on GPU only, for the reason below);
- the attention kernels on an fp8 pool (holding K / k_scale, V / v_scale) against the float64 torch reference on
  the same pool dequantized: the kernels' only extra error is then their own arithmetic, not the fp8 rounding;
- the cache writer (GPU only: the interpreter's float32 -> fp8 conversion rounds wrongly where the value rounds up
  into the next binade, 7.91 -> 4.0 in Triton 3.9) against torch's rounding of the bf16 store.
"""

from __future__ import annotations

import torch

from engine.attention.backend import store_kv
from engine.attention.torch_backend import TorchAttentionBackend
from engine.attention.triton_decode import decode_attention
from engine.attention.triton_prefill import prefill_attention
from engine.layers.quant.fp8 import FP8_DTYPE, FP8_MAX, dequantize_fp8, quantize_fp8_rows
from engine.layers.triton_activation import silu_and_mul
from engine.layers.triton_fp8_linear import Fp8GemvTiles, fp8_gemv, fp8_linear, fp8_linear_silu_and_mul, quantize_rows
from engine.layers.triton_rope import qk_norm_rope_store
from tests.engine.test_triton_attention import BLOCK_SIZE, LAYER, assert_close_per_request, make_batch
from tests.engine.triton_layer_checks import EPS, make_rope_case, rel_error

KV_SCALES = (0.5, 2.0)


def check_fp8_gemv(n: int, k: int, dtype: torch.dtype, device: str, seed: int, bias: bool) -> None:
    """The one-row kernel: x [1, K] in `dtype` times the dequantized weight, within the output dtype's rounding."""
    gen = torch.Generator(device).manual_seed(seed)
    x = torch.randn(1, k, generator=gen, device=device).to(dtype)
    weight, scale = quantize_fp8_rows(torch.randn(n, k, generator=gen, device=device) * k**-0.5)
    b = torch.randn(n, generator=gen, device=device).to(dtype) if bias else None
    got = fp8_gemv(x, weight, scale, b)
    want = x.double() @ dequantize_fp8(weight, scale).double().T + (0 if b is None else b.double())
    assert got.shape == (1, n) and got.dtype == dtype and bool(torch.isfinite(got).all())
    assert rel_error(got, want) < (1e-6 if dtype == torch.float32 else 1e-2)


def check_fp8_gemv_silu_and_mul(
    n: int, k: int, dtype: torch.dtype, device: str, seed: int, bias: bool, tiles: Fp8GemvTiles | None = None
) -> None:
    """The gated GEMV (gate_up and SwiGLU in one launch) equals the GEMV then `silu_and_mul`, bit for bit, with the
    same tiles (default: the shape's); `fp8_linear_silu_and_mul` runs it at one row and the two calls above."""
    gen = torch.Generator(device).manual_seed(seed)
    x = torch.randn(3, k, generator=gen, device=device).to(dtype)
    weight, scale = quantize_fp8_rows(torch.randn(n, k, generator=gen, device=device) * k**-0.5)
    b = torch.randn(n, generator=gen, device=device).to(dtype) if bias else None
    got = fp8_gemv(x[:1], weight, scale, b, tiles, gated=True)
    assert got.shape == (1, n // 2) and torch.equal(got, silu_and_mul(fp8_gemv(x[:1], weight, scale, b, tiles)))
    if tiles is None:
        assert torch.equal(fp8_linear_silu_and_mul(x[:1], weight, scale, b), got)
    if device == "cuda":  # NOTE: three rows run torch._scaled_mm
        assert torch.equal(fp8_linear_silu_and_mul(x, weight, scale, b), silu_and_mul(fp8_linear(x, weight, scale, b)))


def check_quantize_rows(m: int, k: int, dtype: torch.dtype, device: str, seed: int, check_values: bool) -> None:
    """Rows of x (a strided view, sizes spanning 10^-3 to 10^3, one all zero) -> the scales of the torch rule, and
    (check_values) its fp8 values but for at most 0.1% (division rounding at a boundary)."""
    gen = torch.Generator(device).manual_seed(seed)
    wide = torch.randn(m, k + 64, generator=gen, device=device) * torch.logspace(-3, 3, m, device=device)[:, None]
    x = wide.to(dtype)[:, 32 : 32 + k]
    x[m // 2] = 0.0
    q, scale = quantize_rows(x)
    want_q, want_scale = quantize_fp8_rows(x)
    assert q.shape == (m, k) and q.is_contiguous() and scale.shape == (m,)
    assert torch.allclose(scale, want_scale, rtol=1e-6, atol=0.0)
    if check_values:
        mismatch = (q.float() != want_q.float()).float().mean().item()
        assert mismatch < 1e-3, f"{mismatch:.2%} of the fp8 values differ from torch's"


def check_fp8_linear_batch(m: int, n: int, k: int, device: str, seed: int) -> None:
    """`torch._scaled_mm` rows: within fp8 rounding of x (per token, <= 2^-4 relative) of the weight-only product."""
    gen = torch.Generator(device).manual_seed(seed)
    x = torch.randn(m, k, generator=gen, device=device).to(torch.bfloat16)
    weight, scale = quantize_fp8_rows(torch.randn(n, k, generator=gen, device=device) * k**-0.5)
    got = fp8_linear(x, weight, scale, None)
    want = x.double() @ dequantize_fp8(weight, scale).double().T
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    assert rel_error(got, want) < 0.04


def fp8_pool(pool: torch.Tensor, kv_scales: tuple[float, float]) -> torch.Tensor:
    """A pool [..., 2, block, Hkv, D] (K/V on dim -4) as an fp8 cache holding K / k_scale, V / v_scale."""
    scales = torch.tensor(kv_scales, device=pool.device).view(2, 1, 1, 1)
    return (pool.float() / scales).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantized(pool: torch.Tensor, kv_scales: tuple[float, float]) -> torch.Tensor:
    return pool.double() * torch.tensor(kv_scales, device=pool.device, dtype=torch.float64).view(2, 1, 1, 1)


def check_fp8_kv_attention(
    requests: list[tuple[int, int]], heads: tuple[int, int, int], dtype: torch.dtype, device: str, seed: int
) -> None:
    """Decode and prefill kernels on an fp8 pool against the reference on that pool dequantized."""
    batch = make_batch(requests, heads, dtype, device, seed)
    m = batch.metadata
    store_kv(batch.key, batch.value, batch.pool[:, LAYER], m.slot_mapping, BLOCK_SIZE)
    kv_cache = fp8_pool(batch.pool[:, LAYER], KV_SCALES)
    scale = heads[2] ** -0.5
    reference = TorchAttentionBackend(BLOCK_SIZE, scale).forward(
        batch.query.double(), dequantized(kv_cache, KV_SCALES), m
    )
    for num_splits in (1, 3):
        output = torch.empty_like(batch.query)
        args = (batch.query, kv_cache, m.query_start_loc, m.seq_lens, m.block_table, output, scale)
        decode_attention(*args, num_splits=num_splits, kv_scales=KV_SCALES)
        prefill_attention(*args, kv_scales=KV_SCALES)
        tolerance = 2e-2 if dtype == torch.bfloat16 else 5e-3
        assert_close_per_request(output, reference, m.query_start_loc_cpu, tolerance)


def check_fp8_cache_store(dtype: torch.dtype, device: str, seed: int) -> None:
    """The writer's fp8 K/V equal torch's rounding of (its bf16 store / scale) exactly, and it returns the same q as
    into a bf16 cache. Exact: both round the same bf16 value / a power-of-two scale (an exact quotient) to nearest
    even (torch's cast, and cvt.rn.satfinite on Hopper), saturation aside, which the clamp makes the same."""
    case = make_rope_case(33, (16, 8, 128), True, dtype, device, seed)
    args = (case.positions, case.cos_sin_cache, case.q_norm_weight, case.k_norm_weight, EPS)
    q = qk_norm_rope_store(case.qkv, *args, case.pool[:, LAYER], case.slot_mapping, *case.heads)
    cache = torch.zeros(case.pool[:, LAYER].shape, dtype=FP8_DTYPE, device=device)
    q8 = qk_norm_rope_store(case.qkv, *args, cache, case.slot_mapping, *case.heads, kv_scales=KV_SCALES)
    assert torch.equal(q, q8)
    slots = case.slot_mapping[case.slot_mapping >= 0]
    blocks, offsets = slots // BLOCK_SIZE, slots % BLOCK_SIZE
    scales = torch.tensor(KV_SCALES, device=device).view(1, 2, 1, 1)
    want = (case.pool[blocks, LAYER, :, offsets].float() / scales).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    got = cache[blocks, :, offsets]  # [n, 2, Hkv, D]
    mismatch = (got.float() != want.float()).float().mean().item()
    assert mismatch == 0.0, f"{mismatch:.2%} of the stored fp8 values differ from torch's rounding"


def run_interpreted_checks() -> None:
    """Small CPU cases for the Triton interpreter (the process must start with TRITON_INTERPRET=1)."""
    check_fp8_gemv(16, 1024, torch.float32, "cpu", seed=0, bias=True)
    check_fp8_gemv(8, 192, torch.float16, "cpu", seed=1, bias=False)
    check_fp8_gemv_silu_and_mul(16, 1024, torch.float32, "cpu", seed=5, bias=True)
    check_fp8_gemv_silu_and_mul(32, 512, torch.float16, "cpu", seed=6, bias=False, tiles=Fp8GemvTiles(4, 128))
    check_quantize_rows(5, 1500, torch.float16, "cpu", seed=3, check_values=False)
    check_quantize_rows(2, 16400, torch.float16, "cpu", seed=4, check_values=False)
    check_fp8_kv_attention([(40, 1), (0, 1), (17, 5), (0, 20), (70, 1)], (4, 1, 16), torch.float16, "cpu", seed=2)
