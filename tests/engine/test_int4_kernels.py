"""int4 on CUDA: the kernels' packed layout (exact, CPU), the in-memory random checkpoints (bit-equal to the
reference quantizer's), the kernels against `x @ dequant(W)^T` (Triton's interpreter on CPU; real shapes on the GPU),
and an int4 engine's prompt logits against bf16 on the same dequantized weights (GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from engine.layers.quant.int4_layout import act_order_perm, dequantize, pack_kernel_order, unpack_kernel_order
from engine.layers.quant.int4_random import quantized_parts
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.models.shapes import MODEL_SHAPES
from tests.engine.int4_kernel_checks import (
    FORMATS,
    HALF2_CONFIGS,
    check_int4_linear,
    check_int4_silu_and_mul,
    make_case,
    random_case,
)
from tests.engine.int4_reference import Int4Format, quantize_projection
from tests.engine.quant_support import greedy
from tests.engine.triton_interpreter import run_interpreted

GPU_SHAPES = [(4096, 4096), (6144, 4096), (4096, 12288), (1024, 256)]


def _int32(word: int) -> int:
    return int(np.uint32(word).view(np.int32))


def test_kernel_order_puts_nibble_t_of_a_groups_word_w_on_channel_t_times_16_plus_w() -> None:
    channels = torch.arange(256)
    q = torch.stack([channels // 16 % 16, channels % 16])  # row 0: each nibble holds its t (+8 in group 1); row 1: w
    words = pack_kernel_order(q)
    assert words.shape == (2, 32) and words.dtype == torch.int32
    assert words[0].tolist() == [0x76543210] * 16 + [_int32(0xFEDCBA98)] * 16
    assert words[1].tolist() == [_int32(w * 0x11111111) for w in range(16)] * 2
    random_q = torch.randint(0, 16, (5, 384), generator=torch.Generator().manual_seed(0))
    assert torch.equal(unpack_kernel_order(pack_kernel_order(random_q)), random_q)


@pytest.mark.parametrize("name", list(FORMATS))
def test_repacking_keeps_the_reference_weights_exactly(name: str) -> None:
    packed, dequantized = make_case(name, 64, 384, "cpu", seed=3)
    assert torch.equal(dequantize(packed), dequantized)
    assert (packed.perm is not None) == FORMATS[name].act_order
    assert packed.weight.shape == (64, 48) and packed.scale.dtype == torch.float16 and packed.zero.dtype == torch.uint8


def test_act_order_perm_sorts_channels_by_group_and_needs_full_groups() -> None:
    g_idx = torch.arange(256) // 128
    assert act_order_perm(g_idx) is None
    perm = act_order_perm(g_idx.flip(0))
    assert perm is not None and perm.tolist() == list(range(128, 256)) + list(range(128))
    with pytest.raises(ValueError, match="every group 128 channels"):
        act_order_perm(torch.zeros(256, dtype=torch.int32).index_fill(0, torch.tensor([0]), 1))


@pytest.mark.parametrize("fmt", [Int4Format("gptq"), Int4Format("awq", symmetric=False)])
def test_random_checkpoints_equal_the_reference_quantizers(fmt: Int4Format) -> None:
    weight = torch.randn(256, 384, generator=torch.Generator().manual_seed(1)) * 0.02
    want, _ = quantize_projection(weight, fmt, np.random.default_rng(0))
    got = quantized_parts(weight, fmt.method)
    assert sorted(got) == sorted(want)
    assert [part for part in want if not torch.equal(got[part], want[part])] == []


def test_random_int4_weights_load_as_a_checkpoint_of_that_method(tmp_path: Path) -> None:
    """load_format="dummy" with quantization="gptq" (the int4 benchmark path; dequantized here, on the CPU): every
    projection row holds at most 16 values per group of 128, and the model generates."""
    config = {**MODEL_SHAPES["tiny-qwen3"], "hidden_size": 128, "intermediate_size": 256, "head_dim": 32}
    (tmp_path / "config.json").write_text(json.dumps(config))
    engine = LLMEngine(engine_config(str(tmp_path), load_format="dummy", quantization="gptq", num_blocks=16))
    down = engine.runner.model.model.layers[1].mlp.down_proj.weight
    assert down.shape == (128, 256)
    assert max(len(group.unique()) for group in down.reshape(-1, 128)) <= 16
    assert len(greedy(engine, [[1, 2, 3]], 4)[0]) == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests run the compiled kernels")
def test_kernels_in_triton_interpreter() -> None:
    run_interpreted("tests.engine.int4_kernel_checks", "run_interpreted_checks")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[f"{n}x{k}" for n, k in GPU_SHAPES])
@pytest.mark.parametrize("act_order", [False, True], ids=["in-order", "act-order"])
def test_int4_kernels_on_gpu(shape: tuple[int, int], act_order: bool) -> None:
    """bf16 at the 8B projection shapes, each row count on the kernel the tuned table (or heuristic) picks; fp16
    twice."""
    case = random_case(*shape, act_order, "cuda", seed=shape[0] + shape[1])
    for rows in (1, 2, 4, 5, 8, 16, 40, 64, 300):
        check_int4_linear(case, rows, torch.bfloat16, bias=rows == 5, seed=rows)
    check_int4_linear(case, 3, torch.float16, bias=False, seed=0)
    check_int4_linear(case, 100, torch.float16, bias=True, seed=1)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES[:3], ids=[f"{n}x{k}" for n, k in GPU_SHAPES[:3]])
def test_half2_gemv_on_gpu(shape: tuple[int, int]) -> None:
    """The packed half-precision GEMV (inline assembly on the GPU) at the 8B projection shapes, act-order, in bf16
    and fp16, 1 and 3 rows, with and without split-K: within the bf16 bound of float64."""
    case = random_case(*shape, True, "cuda", seed=shape[0] + shape[1])
    for i, config in enumerate(HALF2_CONFIGS):
        for dtype in (torch.bfloat16, torch.float16):
            check_int4_linear(case, 1 + 2 * (i % 2), dtype, bias=i == 0, seed=i, config=config)


@pytest.mark.gpu
@pytest.mark.parametrize("act_order", [False, True], ids=["in-order", "act-order"])
def test_int4_gated_gemv_on_gpu(act_order: bool) -> None:
    """The 8B gate_up (24576x4096) with SwiGLU in the GEMV's launch, at 1 row on the tuned table's GEMV and at 2 and
    3 rows on its GEMM (two calls): bit for bit the GEMV then `silu_and_mul`, in bf16 and fp16."""
    case = random_case(24576, 4096, act_order, "cuda", seed=7)
    for rows, dtype in ((1, torch.bfloat16), (1, torch.float16), (2, torch.bfloat16), (3, torch.float16)):
        check_int4_silu_and_mul(case, rows, dtype, bias=rows == 1 and dtype == torch.float16, seed=rows)
