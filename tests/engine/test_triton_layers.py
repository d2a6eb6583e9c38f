"""The fused Triton layers (RMSNorm, residual add + RMSNorm, q/k norm + RoPE + K/V store, SiLU-and-mul) against
the torch set of the same functions (`engine.layers.torch_ops`).

Each kernel runs on random inputs with strided rows into NaN-filled outputs: float32 within 1e-6 (relative norm)
of torch in float32; bf16/fp16 within 1e-2 of torch in float64 and within a few ulps of torch in that dtype
(RoPE without q/k norm: bit-exact). The RoPE kernel writes one layer of a strided
pool; everything but its written slots (other layers, slot -1 rows) must stay as it was.
GPU tests cover the real shapes (Qwen3-8B, Qwen3-0.6B, Qwen2-0.5B; up to 8192 tokens). Without a GPU, small
float32/fp16 cases run in Triton's interpreter in a child process started with TRITON_INTERPRET=1 (its bf16 casts
truncate, so bf16 runs on the GPU only). The whole module is skipped where triton is not installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from engine.layers import rotary_embedding, torch_ops
from engine.layers.triton_activation import silu_and_mul
from engine.layers.triton_gemv import gemv_supported
from engine.layers.triton_gemv import linear as gemv_linear
from engine.layers.triton_rms_norm import fused_add_rms_norm, rms_norm
from engine.layers.triton_rope import qk_norm_rope_store
from tests.engine.triton_interpreter import run_interpreted

EPS = 1e-6
BLOCK_SIZE = 16
NUM_LAYERS = 3
LAYER = 1
MAX_POSITION = 4096
ROPE_THETA = 1e6
# NOTE: one rounding step apart before a rounded multiply (rstd or exp differ in float32) is this many ulps after.
MAX_ULP = {torch.bfloat16: 2, torch.float16: 3}
REPO_ROOT = Path(__file__).resolve().parents[2]


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


GPU_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# NOTE: (T, hidden): decode and prefill sizes at Qwen2-0.5B (896), Qwen3-0.6B (1024), Qwen3-8B (4096), Llama-70B (8192).
GPU_ROWS = [(1, 4096), (3, 896), (17, 1024), (1, 64), (2048, 4096), (8192, 1024), (333, 8192), (5, 16384)]
# NOTE: (T, intermediate): Qwen3-8B 12288, Qwen3-0.6B 3072, Qwen2-0.5B 4864, and one not a multiple of the block.
GPU_MLP = [(1, 12288), (3, 3072), (17, 4864), (2048, 12288), (8192, 3072), (5, 100)]
GPU_HEADS = [(32, 8, 128), (16, 8, 128), (14, 2, 64), (16, 8, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("rows", GPU_ROWS, ids=lambda r: f"t{r[0]}h{r[1]}")
def test_rms_norm_matches_reference(rows: tuple[int, int], dtype: torch.dtype) -> None:
    check_rms_norm(*rows, dtype, "cuda", seed=rows[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("rows", GPU_ROWS, ids=lambda r: f"t{r[0]}h{r[1]}")
def test_fused_add_rms_norm_matches_reference(rows: tuple[int, int], dtype: torch.dtype) -> None:
    check_fused_add_rms_norm(*rows, dtype, "cuda", seed=rows[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("shape", GPU_MLP, ids=lambda s: f"t{s[0]}i{s[1]}")
def test_silu_and_mul_matches_reference(shape: tuple[int, int], dtype: torch.dtype) -> None:
    check_silu_and_mul(*shape, dtype, "cuda", seed=shape[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("qk_norm", [True, False], ids=["qk-norm", "no-norm"])
@pytest.mark.parametrize("heads", GPU_HEADS, ids=lambda h: f"q{h[0]}kv{h[1]}d{h[2]}")
@pytest.mark.parametrize("num_tokens", [1, 3, 17, 8192])
def test_qk_norm_rope_store_matches_reference(
    num_tokens: int, heads: tuple[int, int, int], qk_norm: bool, dtype: torch.dtype
) -> None:
    check_rope(make_rope_case(num_tokens, heads, qk_norm, dtype, "cuda", seed=num_tokens))


@pytest.mark.gpu
def test_launchers_replay_in_a_cuda_graph() -> None:
    """Captured once, replayed on new inputs: what the replay writes equals an eager run on those inputs."""
    gen = torch.Generator("cuda").manual_seed(0)
    x, residual = random_rows(4, 1024, torch.bfloat16, gen, 1.0), random_rows(4, 1024, torch.bfloat16, gen, 1.0)
    weight, gate_up = random_weight(1024, torch.bfloat16, gen), random_rows(4, 6144, torch.bfloat16, gen, 1.0)
    case = make_rope_case(4, (16, 8, 128), True, torch.bfloat16, "cuda", seed=0)
    rope_args = (case.positions, case.cos_sin_cache, case.q_norm_weight, case.k_norm_weight, EPS)

    def step() -> list[torch.Tensor]:
        q = qk_norm_rope_store(case.qkv, *rope_args, case.pool[:, LAYER], case.slot_mapping, *case.heads)
        return [rms_norm(x, weight, EPS), *fused_add_rms_norm(x, residual, weight, EPS), silu_and_mul(gate_up), q]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for static in (x, residual, gate_up, case.qkv):
        static.copy_(torch.randn(static.shape, generator=gen, device="cuda"))
    case.positions.copy_(case.positions.flip(0))
    case.slot_mapping.copy_(case.slot_mapping.roll(1))
    pool_before = case.pool.clone()
    graph.replay()
    replayed, pool_replayed = [t.clone() for t in captured], case.pool.clone()
    case.pool.copy_(pool_before)
    eager = step()
    assert all(torch.equal(r, e) for r, e in zip(replayed, eager, strict=True))
    assert torch.equal(pool_replayed, case.pool) and not torch.equal(pool_replayed, pool_before)


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


GPU_GEMV = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096), (3072, 1024), (8, 512)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", GPU_GEMV, ids=lambda s: f"n{s[0]}k{s[1]}")
def test_gemv_matches_reference(shape: tuple[int, int], dtype: torch.dtype) -> None:
    check_gemv(*shape, dtype, "cuda", seed=shape[0], bias=shape[0] == 6144)


def test_gemv_leaves_other_shapes_to_f_linear() -> None:
    weight = torch.randn(16, 512)
    assert gemv_supported(weight) and not gemv_supported(torch.randn(16, 100)) and not gemv_supported(weight.t())
    x = torch.randn(2, 512)  # two rows: not a GEMV, and runs here without Triton
    assert torch.equal(gemv_linear(x, weight, None), torch.nn.functional.linear(x, weight))


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests run the compiled kernels")
def test_kernels_in_triton_interpreter() -> None:
    run_interpreted("tests.engine.test_triton_layers", "run_interpreted_checks")


def test_launch_checks_reject_bad_arguments() -> None:
    x, weight = torch.randn(4, 64), torch.randn(64)
    with pytest.raises(ValueError, match="is not \\[T, hidden\\]"):
        rms_norm(x.view(4, 8, 8), weight, EPS)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, weight.half(), EPS)
    with pytest.raises(ValueError, match="unit stride"):
        rms_norm(torch.randn(64, 4).t(), weight, EPS)
    with pytest.raises(ValueError, match="residual_out"):
        fused_add_rms_norm(x, x, weight, EPS, residual_out=torch.empty(4, 32))
    with pytest.raises(ValueError, match="gate_up"):
        silu_and_mul(torch.randn(4, 63))
    with pytest.raises(ValueError, match="out"):
        silu_and_mul(torch.randn(4, 64), out=torch.empty(4, 64))

    case = make_rope_case(5, (4, 2, 16), True, torch.float32, "cpu", seed=0)
    kv_cache = case.pool[:, LAYER]
    good = [case.qkv, case.positions, case.cos_sin_cache, case.q_norm_weight, case.k_norm_weight, EPS, kv_cache]
    good += [case.slot_mapping, 4, 2, 16]

    def rope_with(index: int, value: object) -> None:
        args = list(good)
        args[index] = value
        qk_norm_rope_store(*args)

    with pytest.raises(ValueError, match="qkv"):
        rope_with(0, case.qkv[:, :-16])
    with pytest.raises(ValueError, match="positions"):
        rope_with(1, case.positions.int())
    with pytest.raises(ValueError, match="cos_sin_cache"):
        rope_with(2, case.cos_sin_cache[:, :8])
    with pytest.raises(ValueError, match="together"):
        rope_with(4, None)
    with pytest.raises(ValueError, match="kv_cache"):
        rope_with(6, kv_cache[:, :, :, :1])
    with pytest.raises(ValueError, match="slot_mapping"):
        rope_with(7, case.slot_mapping[:4])
    with pytest.raises(ValueError, match="power of two"):
        rope_with(10, 12)
