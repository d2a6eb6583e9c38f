"""The Triton MoE kernels on the GPU against the torch reference, at Qwen3-30B-A3B's expert shapes (128 experts, top
8, hidden 2048, intermediate 768) and Mixtral-8x7B's (8 experts, top 2, 4096, 14336), from batch 1 to prefill sizes,
with expert parallelism over 2 and 4 ranks, and the whole layer from router logits (the Triton routing; at decode
sizes the pairs' sum in the down projection's launch); captured CUDA graphs replay what eager calls compute; and the
tiny MoE models through the engine on the GPU are greedy token-identical to transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from engine.layers.kernels import moe_sync_counters
from engine.layers.moe import triton_moe
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from tests.engine.model_factory import NEW_TOKENS, hf_greedy, make_prompts, save_tiny_model
from tests.engine.moe_checks import (
    check_fused_moe,
    check_fused_sum,
    check_moe,
    check_routing,
    make_case,
)
from tests.engine.quant_support import greedy

QWEN3_30B_A3B = (128, 8, 2048, 768)
MIXTRAL_8X7B = (8, 2, 4096, 14336)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("num_tokens", [1, 3, 64, 256, 2048])
@pytest.mark.parametrize("num_ranks", [1, 2, 4])
def test_qwen3_30b_a3b_experts_match_reference(num_tokens: int, dtype: torch.dtype, num_ranks: int) -> None:
    check_fused_moe(num_tokens, *QWEN3_30B_A3B, dtype, "cuda", num_ranks=num_ranks)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 17, 512])
def test_mixtral_experts_match_reference(num_tokens: int) -> None:
    check_fused_moe(num_tokens, *MIXTRAL_8X7B, torch.bfloat16, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("num_tokens", [1, 2, 3])
@pytest.mark.parametrize("num_ranks", [1, 2, 4])
def test_qwen3_30b_a3b_layer_from_logits_matches_reference(num_tokens: int, dtype: torch.dtype, num_ranks: int) -> None:
    check_moe(num_tokens, *QWEN3_30B_A3B, dtype, "cuda", num_ranks=num_ranks)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 8, 9])
def test_mixtral_layer_from_logits_matches_reference(num_tokens: int) -> None:
    check_moe(num_tokens, *MIXTRAL_8X7B, torch.bfloat16, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 2048])
def test_routing_matches_torch(num_tokens: int) -> None:
    check_routing(num_tokens, 128, 8, True, "cuda", ties=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("num_tokens", [1, 2])
def test_pairs_sum_in_the_down_launch_matches_its_own_launch(num_tokens: int, dtype: torch.dtype) -> None:
    check_fused_sum(num_tokens, *QWEN3_30B_A3B, dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("with_sync", [False, True])
def test_decode_layer_replays_in_a_cuda_graph(with_sync: bool) -> None:
    x, w13, w2, _, _ = make_case(1, *QWEN3_30B_A3B, torch.bfloat16, "cuda")
    logits = torch.randn(1, 128, device="cuda", dtype=torch.bfloat16)
    sync = moe_sync_counters(2048).cuda() if with_sync else None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        triton_moe.moe(x, logits, w13, w2, 8, True, 0, sync)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = triton_moe.moe(x, logits, w13, w2, 8, True, 0, sync)
    for _ in range(3):  # other experts than the capture's routing chose, each time
        x.normal_()
        logits.normal_()
        graph.replay()
        assert torch.equal(captured, triton_moe.moe(x, logits, w13, w2, 8, True, 0, sync))
    assert sync is None or not sync.any()


@pytest.mark.gpu
def test_fused_moe_replays_in_a_cuda_graph() -> None:
    x, w13, w2, topk_weights, topk_ids = make_case(8, *QWEN3_30B_A3B, torch.bfloat16, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        triton_moe.fused_moe(x, w13, w2, topk_weights, topk_ids, 0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = triton_moe.fused_moe(x, w13, w2, topk_weights, topk_ids, 0)
    new_x, _, _, new_weights, new_ids = make_case(8, 64, 8, 2048, 768, torch.bfloat16, "cuda")
    x.copy_(new_x)
    topk_weights.copy_(new_weights)
    topk_ids.copy_(new_ids * 2)  # other experts than the capture's routing chose
    graph.replay()
    assert torch.equal(captured, triton_moe.fused_moe(x, w13, w2, topk_weights, topk_ids, 0))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_moe_engine_on_gpu_matches_transformers(tmp_path: Path, name: str) -> None:
    """The tiny MoE models through the engine on the GPU (Triton experts inside decode CUDA graphs), float32."""
    path = save_tiny_model(name, tmp_path / name)
    prompts = make_prompts(vocab_size=512)
    expected = hf_greedy(path, prompts, NEW_TOKENS, device="cuda")
    engine = LLMEngine(
        engine_config(str(path), device="cuda", dtype="float32", num_blocks=1024, long_prefill_token_threshold=48)
    )
    assert engine.runner.cuda_graphs is not None
    assert greedy(engine, prompts, NEW_TOKENS) == expected
