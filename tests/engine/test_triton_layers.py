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

import pytest
import torch

pytest.importorskip("triton")

from engine.layers.triton_activation import silu_and_mul
from engine.layers.triton_gemv import gemv_supported
from engine.layers.triton_gemv import linear as gemv_linear
from engine.layers.triton_rms_norm import fused_add_rms_norm, rms_norm
from engine.layers.triton_rope import qk_norm_rope_store
from tests.engine.triton_interpreter import run_interpreted
from tests.engine.triton_layer_checks import (
    EPS,
    LAYER,
    check_fused_add_rms_norm,
    check_gemv,
    check_gemv_silu_and_mul,
    check_rms_norm,
    check_rope,
    check_silu_and_mul,
    make_rope_case,
    random_rows,
    random_weight,
)

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


GPU_GEMV = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096), (3072, 1024), (8, 512)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", GPU_GEMV, ids=lambda s: f"n{s[0]}k{s[1]}")
def test_gemv_matches_reference(shape: tuple[int, int], dtype: torch.dtype) -> None:
    check_gemv(*shape, dtype, "cuda", seed=shape[0], bias=shape[0] == 6144)


# NOTE: gate_up of Qwen3-8B, Qwen3-0.6B, and Qwen2-0.5B (K = 896: no GEMV tiling, so F.linear then silu_and_mul).
GPU_GATE_UP = [(24576, 4096), (6144, 1024), (9728, 896)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", GPU_GATE_UP, ids=lambda s: f"n{s[0]}k{s[1]}")
def test_gated_gemv_is_the_gemv_then_silu_and_mul(shape: tuple[int, int], dtype: torch.dtype) -> None:
    check_gemv_silu_and_mul(*shape, dtype, "cuda", seed=shape[1], bias=shape[0] == 6144)


def test_gemv_leaves_other_shapes_to_f_linear() -> None:
    weight = torch.randn(16, 512)
    assert gemv_supported(weight) and not gemv_supported(torch.randn(16, 100)) and not gemv_supported(weight.t())
    x = torch.randn(2, 512)  # two rows: not a GEMV, and runs here without Triton
    assert torch.equal(gemv_linear(x, weight, None), torch.nn.functional.linear(x, weight))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests run the compiled kernels")
def test_kernels_in_triton_interpreter() -> None:
    run_interpreted("tests.engine.triton_layer_checks", "run_interpreted_checks")


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
