"""What each fused Triton layer must satisfy against the torch set of the same functions (`engine.layers.torch_ops`),
on any device and shape: the checks that tests/engine/test_triton_layers.py runs on the GPU's real shapes, and
`run_interpreted_checks` (small CPU cases) runs in Triton's interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.layers import rotary_embedding, torch_ops
from engine.layers.triton_activation import silu_and_mul
from engine.layers.triton_gemv import gemv_supported, linear_silu_and_mul
from engine.layers.triton_gemv import linear as gemv_linear
from engine.layers.triton_rms_norm import fused_add_rms_norm, rms_norm
from engine.layers.triton_rope import qk_norm_rope_store

EPS = 1e-6
BLOCK_SIZE = 16
NUM_LAYERS = 3
LAYER = 1
MAX_POSITION = 4096
ROPE_THETA = 1e6
# NOTE: one rounding step apart before a rounded multiply (rstd or exp differ in float32) is this many ulps after.
MAX_ULP = {torch.bfloat16: 2, torch.float16: 3}


def random_rows(num_rows: int, width: int, dtype: torch.dtype, gen: torch.Generator, scale: float) -> torch.Tensor:
    """[num_rows, width] normal values (never zero) as a view with padded rows, as a slice of a wider buffer.

    NOTE: 16 columns of padding keep a 16-divisible width's rows 16-divisible, the kernels' vectorized variant.
    """
    buffer = torch.randn(num_rows, width + 16, generator=gen, device=gen.device) * scale
    return buffer.to(dtype)[:, :width]


def random_weight(size: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return (1 + 0.3 * torch.randn(size, generator=gen, device=gen.device)).to(dtype)


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


def max_ulp_diff(got: torch.Tensor, want: torch.Tensor) -> int:
    """Largest distance in representable values between two 16-bit float tensors."""

    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = t.view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return int((ordered(got) - ordered(want)).abs().max())


def check_close(got: torch.Tensor, want: torch.Tensor, want64: torch.Tensor, max_ulp: int | None) -> None:
    """got (fully written: finite) against the reference in its dtype and in float64; max_ulp applies to 16-bit."""
    assert got.shape == want.shape and got.dtype == want.dtype
    assert bool(torch.isfinite(got).all()), "an output element was not written"
    if got.dtype == torch.float32:
        assert rel_error(got, want) < 1e-6 and rel_error(got, want64) < 1e-6
        return
    error = rel_error(got, want64)
    assert error < 1e-2, f"relative error {error:.2e} vs float64"
    if max_ulp is not None:
        ulps = max_ulp_diff(got, want)
        assert ulps <= max_ulp, f"{ulps} ulps from the torch {got.dtype} path"


def nan_like(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def check_rms_norm(num_tokens: int, hidden: int, dtype: torch.dtype, device: str, seed: int) -> None:
    gen = torch.Generator(device).manual_seed(seed)
    x = random_rows(num_tokens, hidden, dtype, gen, scale=3.0)
    weight = random_weight(hidden, dtype, gen)
    out = rms_norm(x, weight, EPS, out=nan_like(x.shape, dtype, x.device))
    reference64 = torch_ops.rms_norm(x.double(), weight.double(), EPS)
    check_close(out, torch_ops.rms_norm(x, weight, EPS), reference64, MAX_ULP.get(dtype))
    assert torch.equal(rms_norm(x, weight, EPS), out)


def check_fused_add_rms_norm(num_tokens: int, hidden: int, dtype: torch.dtype, device: str, seed: int) -> None:
    """Into NaN-filled outputs, then in place (out=x, residual_out=residual); the sum is exact in the dtype."""
    gen = torch.Generator(device).manual_seed(seed)
    x = random_rows(num_tokens, hidden, dtype, gen, scale=1.0)
    residual = random_rows(num_tokens, hidden, dtype, gen, scale=4.0)
    weight = random_weight(hidden, dtype, gen)
    want, want_sum = torch_ops.fused_add_rms_norm(x, residual, weight, EPS)
    want64 = torch_ops.rms_norm(want_sum.double(), weight.double(), EPS)
    outputs = nan_like(x.shape, dtype, x.device), nan_like(x.shape, dtype, x.device)
    out, residual_out = fused_add_rms_norm(x, residual, weight, EPS, *outputs)
    assert out is outputs[0] and residual_out is outputs[1]
    assert torch.equal(residual_out, want_sum)
    check_close(out, want, want64, MAX_ULP.get(dtype))
    in_place = fused_add_rms_norm(x, residual, weight, EPS, out=x, residual_out=residual)
    assert in_place[0] is x and in_place[1] is residual
    assert torch.equal(x, out) and torch.equal(residual, residual_out)


def check_silu_and_mul(num_tokens: int, intermediate: int, dtype: torch.dtype, device: str, seed: int) -> None:
    gen = torch.Generator(device).manual_seed(seed)
    # NOTE: scale 2 keeps silu(gate) out of fp16's subnormals, where one rounding step times a large `up` is many ulps.
    gate_up = random_rows(num_tokens, 2 * intermediate, dtype, gen, scale=2.0)
    out = silu_and_mul(gate_up, out=nan_like((num_tokens, intermediate), dtype, gate_up.device))
    reference64 = torch_ops.silu_and_mul(gate_up.double())
    check_close(out, torch_ops.silu_and_mul(gate_up), reference64, MAX_ULP.get(dtype))
    assert torch.equal(silu_and_mul(gate_up), out)


@dataclass(slots=True)
class RopeCase:
    qkv: torch.Tensor
    positions: torch.Tensor
    cos_sin_cache: torch.Tensor
    q_norm_weight: torch.Tensor | None
    k_norm_weight: torch.Tensor | None
    pool: torch.Tensor
    slot_mapping: torch.Tensor
    heads: tuple[int, int, int]


def make_rope_case(
    num_tokens: int, heads: tuple[int, int, int], qk_norm: bool, dtype: torch.dtype, device: str, seed: int
) -> RopeCase:
    """A fused qkv projection with strided rows, random positions, distinct random slots of which every third
    (from the second) is -1, and a random pool of NUM_LAYERS layers."""
    num_q_heads, num_kv_heads, head_dim = heads
    gen = torch.Generator(device).manual_seed(seed)
    qkv = random_rows(num_tokens, (num_q_heads + 2 * num_kv_heads) * head_dim, dtype, gen, scale=2.0)
    positions = torch.randint(0, MAX_POSITION, (num_tokens,), generator=gen, device=device)
    num_blocks = num_tokens // BLOCK_SIZE + 3
    slot_mapping = torch.randperm(num_blocks * BLOCK_SIZE, generator=gen, device=device)[:num_tokens]
    slot_mapping[1::3] = -1
    shape = (num_blocks, NUM_LAYERS, 2, BLOCK_SIZE, num_kv_heads, head_dim)
    pool = torch.randn(shape, generator=gen, device=device).to(dtype)
    weights = [random_weight(head_dim, dtype, gen) if qk_norm else None for _ in range(2)]
    cos_sin_cache = rotary_embedding.cos_sin_cache(head_dim, MAX_POSITION, ROPE_THETA, None).to(device)
    return RopeCase(qkv, positions, cos_sin_cache, weights[0], weights[1], pool, slot_mapping, heads)


def check_rope(case: RopeCase) -> None:
    """q and the stored k within tolerance (bit-exact without q/k norm), v copied exactly, nothing else written."""
    num_tokens, dtype = case.qkv.shape[0], case.qkv.dtype
    q_norm, k_norm = case.q_norm_weight, case.k_norm_weight
    args = (case.positions, case.cos_sin_cache, q_norm, k_norm, EPS)
    original = case.pool.clone()
    expected = case.pool.clone()
    want = torch_ops.qk_norm_rope_store(case.qkv, *args, expected[:, LAYER], case.slot_mapping, *case.heads)
    pool64 = case.pool.double()
    weights64 = [w.double() if w is not None else None for w in (q_norm, k_norm)]
    args64 = (case.positions, case.cos_sin_cache, *weights64, EPS, pool64[:, LAYER], case.slot_mapping)
    want64 = torch_ops.qk_norm_rope_store(case.qkv.double(), *args64, *case.heads)

    out = nan_like((num_tokens, case.heads[0], case.heads[2]), dtype, case.qkv.device)
    q = qk_norm_rope_store(case.qkv, *args, case.pool[:, LAYER], case.slot_mapping, *case.heads, out=out)
    # NOTE: q/k norm rounds within an ulp or two of torch, which the rotation's cancellations can make many ulps.
    max_ulp = 0 if q_norm is None else None
    assert q is out
    check_close(q, want, want64, max_ulp)

    slots = case.slot_mapping[case.slot_mapping >= 0]
    blocks, offsets = slots // BLOCK_SIZE, slots % BLOCK_SIZE
    written = case.pool[blocks, LAYER, :, offsets]  # [n, 2, Hkv, D]
    check_close(written[:, 0], expected[blocks, LAYER, 0, offsets], pool64[blocks, LAYER, 0, offsets], max_ulp)
    assert torch.equal(written[:, 1], expected[blocks, LAYER, 1, offsets])
    original[blocks, LAYER, :, offsets] = written
    assert torch.equal(case.pool, original), "the kernel wrote outside its slots"
    again = qk_norm_rope_store(case.qkv, *args, case.pool[:, LAYER], case.slot_mapping, *case.heads)
    assert again.is_contiguous() and torch.equal(again, q)


def check_gemv(n: int, k: int, dtype: torch.dtype, device: str, seed: int, bias: bool) -> None:
    """The one-row GEMV against a float64 F.linear; the weight is a strided view (rows padded), as no layer makes."""
    gen = torch.Generator(device).manual_seed(seed)
    x = torch.randn(1, k, generator=gen, device=device).to(dtype)
    weight = random_rows(n, k, dtype, gen, scale=k**-0.5)
    b = torch.randn(n, generator=gen, device=device).to(dtype) if bias else None
    assert gemv_supported(weight)
    got = gemv_linear(x, weight, b)
    want64 = torch.nn.functional.linear(x.double(), weight.double(), None if b is None else b.double())
    assert got.shape == (1, n) and got.dtype == dtype and bool(torch.isfinite(got).all())
    assert rel_error(got, want64) < (1e-6 if dtype == torch.float32 else 1e-2)


def check_gemv_silu_and_mul(n: int, k: int, dtype: torch.dtype, device: str, seed: int, bias: bool) -> None:
    """The gated GEMV (gate_up and SwiGLU in one launch) equals the GEMV then `silu_and_mul`, bit for bit; at two rows
    it is those two calls."""
    gen = torch.Generator(device).manual_seed(seed)
    x = torch.randn(2, k, generator=gen, device=device).to(dtype)
    weight = random_rows(n, k, dtype, gen, scale=k**-0.5)
    b = torch.randn(n, generator=gen, device=device).to(dtype) if bias else None
    got = linear_silu_and_mul(x[:1], weight, b)
    assert got.shape == (1, n // 2) and torch.equal(got, silu_and_mul(gemv_linear(x[:1], weight, b)))
    assert torch.equal(linear_silu_and_mul(x, weight, b), silu_and_mul(gemv_linear(x, weight, b)))


def run_interpreted_checks() -> None:
    """Small CPU cases for the Triton interpreter (the process must start with TRITON_INTERPRET=1)."""
    for dtype in (torch.float32, torch.float16):
        check_rms_norm(3, 64, dtype, "cpu", seed=0)
        check_rms_norm(1, 896, dtype, "cpu", seed=1)
        check_fused_add_rms_norm(3, 96, dtype, "cpu", seed=2)
        check_silu_and_mul(3, 1500, dtype, "cpu", seed=3)
        check_rope(make_rope_case(17, (4, 2, 64), True, dtype, "cpu", seed=4))
        check_rope(make_rope_case(3, (14, 2, 64), False, dtype, "cpu", seed=5))
        check_rope(make_rope_case(1, (16, 8, 128), True, dtype, "cpu", seed=6))
    check_gemv(16, 1024, torch.float32, "cpu", seed=7, bias=True)
    check_gemv(8, 512, torch.float32, "cpu", seed=8, bias=False)
    check_gemv_silu_and_mul(16, 1024, torch.float32, "cpu", seed=9, bias=True)
    check_gemv_silu_and_mul(32, 512, torch.float16, "cpu", seed=10, bias=False)
