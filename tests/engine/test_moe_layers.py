"""MoE layers on the CPU: routing as transformers routes, the torch expert computation against transformers' experts,
the sort of pairs by expert (exact values), the Triton kernels in Triton's interpreter, the config fields and the
parallel size checks."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from transformers import MixtralConfig, Qwen3MoeConfig
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts, Qwen3MoeTopKRouter

from common.errors import InvalidArgumentError
from engine.layers.moe import torch_moe
from engine.layers.moe.align import align_by_expert
from engine.layers.moe.routing import select_experts
from engine.models.arch_config import ArchConfig
from engine.parallel.rank import check_parallel_sizes
from tests.engine.model_factory import TINY_CONFIGS
from tests.engine.moe_checks import make_case
from tests.engine.triton_interpreter import run_interpreted


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_routing_matches_qwen3_moe_router(norm_topk_prob: bool) -> None:
    config = Qwen3MoeConfig(hidden_size=16, num_experts=8, num_experts_per_tok=3, norm_topk_prob=norm_topk_prob)
    router = Qwen3MoeTopKRouter(config)
    torch.manual_seed(0)
    router.weight.data.normal_()
    x = torch.randn(10, 16)
    _, expected_weights, expected_ids = router(x)
    weights, ids = select_experts(x @ router.weight.T, 3, norm_topk_prob)
    assert torch.equal(ids, expected_ids)
    assert torch.allclose(weights, expected_weights, atol=1e-7, rtol=0)
    assert torch.allclose(weights.sum(-1), torch.ones(10)) == norm_topk_prob


def test_routing_matches_mixtral_router() -> None:
    router = MixtralTopKRouter(MixtralConfig(hidden_size=16, num_local_experts=4, num_experts_per_tok=2))
    torch.manual_seed(1)
    router.weight.data.normal_()
    x = torch.randn(10, 16)
    _, expected_weights, expected_ids = router(x)
    weights, ids = select_experts(x @ router.weight.T, 2, renormalize=True)
    assert torch.equal(ids, expected_ids)
    assert torch.allclose(weights, expected_weights, atol=1e-7, rtol=0)


def test_torch_experts_match_transformers_and_split_over_ranks() -> None:
    x, w13, w2, topk_weights, topk_ids = make_case(24, 8, 2, 16, 12, torch.float32, "cpu")
    experts = Qwen3MoeExperts(Qwen3MoeConfig(hidden_size=16, moe_intermediate_size=12, num_experts=8))
    experts.gate_up_proj.data.copy_(w13)
    experts.down_proj.data.copy_(w2)
    with torch.no_grad():
        expected = experts(x, topk_ids, topk_weights)
    assert torch.allclose(torch_moe.fused_moe(x, w13, w2, topk_weights, topk_ids, 0), expected, atol=1e-6, rtol=0)
    halves = [torch_moe.fused_moe(x, w13[s : s + 4], w2[s : s + 4], topk_weights, topk_ids, s) for s in (0, 4)]
    assert torch.allclose(halves[0] + halves[1], expected, atol=1e-6, rtol=0)


def test_align_by_expert_groups_pairs_in_blocks() -> None:
    # 4 tokens x top-2 = pairs 0..7 over global experts 2..5 (this rank holds experts 2, 3, 4); block of 2 rows.
    topk_ids = torch.tensor([[3, 5], [2, 3], [3, 4], [5, 2]])
    blocks = align_by_expert(topk_ids, num_local_experts=3, first_expert=2, block_m=2)
    none = 8
    # expert 2 (local 0): pairs 2, 7; expert 3: pairs 0, 3, 4 (+ padding); expert 4: pair 5 (+ padding); 5: elsewhere.
    assert blocks.sorted_pair_ids.tolist() == [2, 7, 0, 3, 4, none, 5, none, none, none, none, none]
    assert blocks.block_expert_ids.tolist() == [0, 1, 1, 2, -1, -1]


def test_triton_fused_moe_in_the_interpreter() -> None:
    pytest.importorskip("triton")
    run_interpreted("tests.engine.moe_checks", "run_interpreted_checks")


def _raw(name: str, architecture: str) -> dict[str, Any]:
    return {**TINY_CONFIGS[name].to_dict(), "architectures": [architecture]}


def test_arch_config_reads_the_moe_fields() -> None:
    qwen = ArchConfig.from_dict(_raw("qwen3_moe", "Qwen3MoeForCausalLM"))
    assert qwen.moe is not None and qwen.qk_norm
    assert (qwen.moe.num_experts, qwen.moe.num_experts_per_tok, qwen.moe.moe_intermediate_size) == (8, 2, 32)
    assert qwen.moe.norm_topk_prob and qwen.moe.sparse_layers == (0, 2)
    step = ArchConfig.from_dict(
        {**_raw("qwen3_moe", "Qwen3MoeForCausalLM"), "decoder_sparse_step": 3, "num_experts": 6}
    )
    assert step.moe is not None and step.moe.sparse_layers == (2,) and step.moe.num_experts == 6
    mixtral = ArchConfig.from_dict(_raw("mixtral", "MixtralForCausalLM"))
    assert mixtral.moe is not None and mixtral.head_dim == 16
    assert (mixtral.moe.num_experts, mixtral.moe.moe_intermediate_size, mixtral.moe.norm_topk_prob) == (4, 128, True)
    assert mixtral.moe.expert_names == ("w1", "w3", "w2") and mixtral.moe.sparse_layers == (0, 1)


def test_parallel_sizes_split_experts_or_their_rows() -> None:
    arch = ArchConfig.from_dict(_raw("qwen3_moe", "Qwen3MoeForCausalLM"))
    assert arch.moe is not None
    check_parallel_sizes(arch, 2, 1, expert_parallel=True)
    check_parallel_sizes(arch, 2, 1)
    odd_rows = dataclasses.replace(arch, moe=dataclasses.replace(arch.moe, moe_intermediate_size=33))
    with pytest.raises(InvalidArgumentError, match="moe_intermediate_size 33 is not divisible"):
        check_parallel_sizes(odd_rows, 2, 1)
    check_parallel_sizes(odd_rows, 2, 1, expert_parallel=True)
    six_experts = dataclasses.replace(arch, moe=dataclasses.replace(arch.moe, num_experts=6))
    with pytest.raises(InvalidArgumentError, match="num_experts 6 is not divisible by tensor_parallel_size 4"):
        check_parallel_sizes(six_experts, 4, 1, expert_parallel=True)
    check_parallel_sizes(six_experts, 4, 1)
