"""Which part of the model each rank holds: heads, KV heads (replicated past num_kv_heads), layers, checkpoint
slices; and the start-up errors for sizes that do not split the model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from common.errors import InvalidArgumentError
from engine.attention.torch_backend import TorchAttentionBackend
from engine.config import EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from engine.llm import engine_config
from engine.models.arch_config import ArchConfig
from engine.models.loader import build_model
from engine.parallel.communicator import Communicator
from engine.parallel.rank import ParallelRank, check_parallel_sizes
from engine.parallel.weights import checkpoint_targets
from engine.spec.config import SpeculativeConfig
from tests.engine.model_factory import TINY_CONFIGS

# 4 heads, 2 KV heads, 2 layers, head_dim 32, intermediate 128, vocab 512
QWEN3 = ArchConfig.from_dict({**TINY_CONFIGS["qwen3"].to_dict(), "architectures": ["Qwen3ForCausalLM"]})


def test_world_rank_puts_tp_ranks_of_a_stage_side_by_side() -> None:
    ranks = [ParallelRank.of_world_rank(r, tp_size=2, pp_size=3) for r in range(6)]
    assert [(r.tp_rank, r.pp_rank) for r in ranks] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert [r.world_rank for r in ranks] == list(range(6))
    assert [(r.is_first_stage, r.is_last_stage) for r in ranks[::2]] == [(True, False), (False, False), (False, True)]


def test_kv_heads_split_or_replicate() -> None:
    assert [ParallelRank(r, 2).kv_heads(4) for r in range(2)] == [slice(0, 2), slice(2, 4)]
    assert [ParallelRank(r, 3).kv_heads(3) for r in range(3)] == [slice(0, 1), slice(1, 2), slice(2, 3)]
    # 4 ranks, 2 KV heads: ranks 0-1 read head 0 (their query heads 0-3 of 8), ranks 2-3 head 1.
    assert [ParallelRank(r, 4).kv_heads(2) for r in range(4)] == [slice(0, 1), slice(0, 1), slice(1, 2), slice(1, 2)]


def test_stage_layers_give_the_remainder_to_the_first_stages() -> None:
    assert [ParallelRank(0, 1, p, 3).stage_layers(8) for p in range(3)] == [range(0, 3), range(3, 6), range(6, 8)]
    assert [ParallelRank(0, 1, p, 2).stage_layers(2) for p in range(2)] == [range(0, 1), range(1, 2)]


def test_sizes_that_do_not_split_the_model_are_refused_naming_the_field() -> None:
    smollm2 = dataclasses.replace(QWEN3, num_heads=9, num_kv_heads=3, vocab_size=49152, intermediate_size=1536)
    with pytest.raises(InvalidArgumentError, match="num_attention_heads 9 is not divisible by tensor_parallel_size 2"):
        check_parallel_sizes(smollm2, 2, 1)
    check_parallel_sizes(smollm2, 3, 1)
    with pytest.raises(InvalidArgumentError, match="vocab_size 49153 is not divisible by tensor_parallel_size 3"):
        check_parallel_sizes(dataclasses.replace(smollm2, vocab_size=49153), 3, 1)
    with pytest.raises(InvalidArgumentError, match="num_key_value_heads 3 neither divides"):
        check_parallel_sizes(dataclasses.replace(smollm2, num_heads=12), 4, 1)
    with pytest.raises(InvalidArgumentError, match="num_hidden_layers 2 is fewer than pipeline_parallel_size 3"):
        check_parallel_sizes(QWEN3, 1, 3)


def test_config_fields_and_async_scheduling_with_pipeline_stages() -> None:
    with pytest.raises(InvalidArgumentError, match="tensor_parallel_size"):
        ParallelConfig(tensor_parallel_size=0)
    assert ParallelConfig(2, 3).world_size == 6
    with pytest.raises(InvalidArgumentError, match="async_scheduling"):
        EngineConfig(scheduler=SchedulerConfig(async_scheduling=True), parallel=ParallelConfig(1, 2))


def test_speculation_and_unsliced_quantizations_are_refused_with_parallel_sizes() -> None:
    tp2, pp2 = ParallelConfig(tensor_parallel_size=2), ParallelConfig(pipeline_parallel_size=2)
    with pytest.raises(InvalidArgumentError, match=r"^speculative_config: runs on one device only"):
        EngineConfig(parallel=pp2, speculative_config=SpeculativeConfig())
    with pytest.raises(InvalidArgumentError, match=r"^speculative_config: runs on one device only"):
        engine_config("x", tensor_parallel_size=2, speculative_config={"num_speculative_tokens": 2})
    for quantization in ("fp8", "gptq", "awq"):
        with pytest.raises(InvalidArgumentError, match=f"^quantization: '{quantization}' runs on one device only"):
            EngineConfig(ModelConfig(quantization=quantization), parallel=tp2)
    assert EngineConfig(ModelConfig(quantization="int8"), parallel=tp2).parallel.world_size == 2
    config = engine_config("x", quantization="fp8", speculative_config={"num_speculative_tokens": 2})
    assert config.speculative_config == SpeculativeConfig(num_speculative_tokens=2)


def _shard(rank: ParallelRank) -> dict[str, tuple[int, slice, bool] | None]:
    model = build_model(
        QWEN3, TorchAttentionBackend(16, 1.0), torch.float32, torch.device("cpu"), None, Communicator(rank)
    )
    targets = checkpoint_targets(model, QWEN3.tie_word_embeddings)
    return {name: None if part is None else (part.dim, part.index, part.zero) for name, (_, part) in targets.items()}


def test_each_rank_reads_its_slices_of_the_checkpoint() -> None:
    last_tp1 = _shard(ParallelRank(1, 2, 1, 2))
    # Stage 1 of 2 holds layer 1, the final norm and the lm_head; TP rank 1 its half of each split dimension.
    assert sorted(n for n in last_tp1 if not n.startswith("model.layers.1.")) == ["lm_head.weight", "model.norm.weight"]
    assert last_tp1["lm_head.weight"] == (0, slice(256, 512), False)
    attn = "model.layers.1.self_attn"
    assert last_tp1[f"{attn}.q_proj.weight"] == (0, slice(64, 128), False)  # heads 2-3 of 4, head_dim 32
    assert last_tp1[f"{attn}.k_proj.weight"] == last_tp1[f"{attn}.v_proj.weight"] == (0, slice(32, 64), False)
    assert last_tp1[f"{attn}.o_proj.weight"] == (1, slice(64, 128), False)
    assert last_tp1[f"{attn}.q_norm.weight"] is None
    assert last_tp1["model.layers.1.mlp.gate_proj.weight"] == (0, slice(64, 128), False)
    assert last_tp1["model.layers.1.mlp.down_proj.weight"] == (1, slice(64, 128), False)
    first_tp0 = _shard(ParallelRank(0, 2, 0, 2))
    assert first_tp0["model.embed_tokens.weight"] == (0, slice(0, 256), False)
    assert "lm_head.weight" not in first_tp0 and not any(n.startswith("model.layers.1.") for n in first_tp0)
