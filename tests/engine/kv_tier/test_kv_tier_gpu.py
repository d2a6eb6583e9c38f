"""The host tier on a GPU (async scheduling, CUDA graphs, pinned host memory, copies on the stream): a swapped or
host-tier request's greedy output is the one it has without preemption, and weight offload changes no token and
loads a model larger than the device memory the process may use."""

from __future__ import annotations

import gc
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.models.loader import hf_state_dict
from engine.models.shapes import MODEL_SHAPES
from tests.engine.model_factory import make_prompts, save_tiny_model
from tests.engine.quant_support import greedy

pytestmark = pytest.mark.gpu

NEW_TOKENS = 32
GPU = {"device": "cuda", "dtype": "float32", "max_model_len": 400}
MIB, GIB = 2**20, 2**30
# A Qwen3 shape of 8 decoder layers in bfloat16, 1.18 GiB of weights: each layer q|k|v 4096 x 2048, o 2048 x 2048,
# gate|up 16384 x 2048, down 2048 x 8192, q/k norms 128 each, two norms 2048 each (120 MiB); embedding and lm_head
# 32000 x 2048 each.
OFFLOAD_SHAPE = {
    **MODEL_SHAPES["tiny-qwen3"],
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
}
OFFLOAD_LAYER_NBYTES = (4096 * 2048 + 2048 * 2048 + 16384 * 2048 + 2048 * 8192 + 2 * 128 + 2 * 2048) * 2
OFFLOAD_MODEL_NBYTES = 8 * OFFLOAD_LAYER_NBYTES + 2 * 32000 * 2048 * 2 + 2048 * 2


@pytest.fixture(scope="module")
def gpu_case(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[int]], list[list[int]]]:
    path = save_tiny_model("qwen3", tmp_path_factory.mktemp("gpu-kv-tier"))
    prompts = make_prompts(vocab_size=512)
    return path, prompts, greedy(LLMEngine(engine_config(str(path), num_blocks=1024, **GPU)), prompts, NEW_TOKENS)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"enable_prefix_caching": False},
        {"host_prefix_cache": False},
        {},
        {"enforce_eager": True},
    ],
    ids=["swap-only", "device-prefix-cache", "host-prefix-cache", "eager"],
)
def test_swap_and_host_tier_match_unpreempted_output(
    gpu_case: tuple[Path, list[list[int]], list[list[int]]], kwargs: dict[str, Any]
) -> None:
    path, prompts, expected = gpu_case
    engine = LLMEngine(
        engine_config(
            str(path),
            num_blocks=40,
            long_prefill_token_threshold=64,
            swap_space=0.01,
            swap_min_tokens=64,
            **GPU,
            **kwargs,
        )
    )
    assert engine.async_scheduling
    assert greedy(engine, prompts, NEW_TOKENS) == expected
    swapper = engine.scheduler.swapper
    assert swapper is not None and swapper.num_swapped_out > 0
    assert (swapper.swapped, swapper.host.num_free_slots) == ({}, swapper.host.num_slots)
    assert swapper.copier.host_pool.is_pinned()  # type: ignore[attr-defined]
    # The same prompts again: with the host prefix tier, some prefixes come back from the host.
    assert greedy(engine, prompts, NEW_TOKENS) == expected
    assert engine.kv_cache_manager.num_free_blocks == 40


def test_weight_offload_on_gpu(gpu_case: tuple[Path, list[list[int]], list[list[int]]]) -> None:
    path, prompts, expected = gpu_case
    engine = LLMEngine(engine_config(str(path), num_blocks=1024, cpu_offload_gb=0.1 / 1024, **GPU))
    assert len(engine.runner.offloaded_layers) == 2
    assert engine.runner.offloaded_layers[0].host["mlp.gate_up_proj.weight"].is_pinned()
    assert greedy(engine, prompts, NEW_TOKENS) == expected


def test_weight_offload_loads_a_model_larger_than_the_memory_cap(tmp_path: Path) -> None:
    """Capped below the model's weights, the process loads the model with cpu_offload_gb: its peak device memory at
    load is the device layers, one staging layer and the KV pool (never the whole model), and it decodes the tokens
    the same model decodes uncapped without offload."""
    (tmp_path / "config.json").write_text(json.dumps(OFFLOAD_SHAPE))
    config: dict[str, Any] = {
        "device": "cuda",
        "dtype": "bfloat16",
        "max_model_len": 256,
        "num_blocks": 64,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 256,
    }
    rng = random.Random(5)
    prompts = [[rng.randrange(32000) for _ in range(n)] for n in (7, 60, 150)]
    reference = LLMEngine(engine_config(str(tmp_path), load_format="dummy", **config))
    expected = greedy(reference, prompts, NEW_TOKENS)
    weights = {name: tensor.cpu() for name, tensor in hf_state_dict(reference.runner.model).items()}
    assert sum(t.numel() * t.element_size() for t in weights.values()) == OFFLOAD_MODEL_NBYTES
    save_file(weights, tmp_path / "model.safetensors")
    del reference, weights
    gc.collect()
    torch.cuda.empty_cache()

    # 5 layers' memory saved: the last 6 layers in host memory, streamed through one staging layer on the device.
    offload_gb = 5 * OFFLOAD_LAYER_NBYTES / GIB
    resident_nbytes = OFFLOAD_MODEL_NBYTES - 6 * OFFLOAD_LAYER_NBYTES + OFFLOAD_LAYER_NBYTES
    # NOTE: the cap (on memory the allocator reserves) leaves room for the resident weights and 2 layers' worth
    # (240 MiB) of KV pool (32 MiB), workspaces and CUDA graphs, but not for the whole model.
    cap_nbytes = OFFLOAD_MODEL_NBYTES - 2 * OFFLOAD_LAYER_NBYTES
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + cap_nbytes) / total)
    try:
        torch.cuda.reset_peak_memory_stats()
        allocated = torch.cuda.memory_allocated()
        engine = LLMEngine(engine_config(str(tmp_path), cpu_offload_gb=offload_gb, **config))
        peak_nbytes = torch.cuda.max_memory_allocated() - allocated
        assert engine.runner.model.model.host_layers == range(2, 8)
        offloaded = engine.runner.offloaded_layers
        assert sum(t.numel() * t.element_size() for t in offloaded[0].staging.values()) == OFFLOAD_LAYER_NBYTES
        assert all(t.is_pinned() for layer in offloaded for t in layer.host.values())
        # NOTE: besides the weights, the KV pool and up to 96 MiB of cuBLAS workspaces, CUDA graphs and buffers.
        kv_nbytes = engine.runner.kv_cache.numel() * engine.runner.kv_cache.element_size()
        assert resident_nbytes + kv_nbytes <= peak_nbytes < resident_nbytes + kv_nbytes + 96 * MIB
        assert greedy(engine, prompts, NEW_TOKENS) == expected
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
