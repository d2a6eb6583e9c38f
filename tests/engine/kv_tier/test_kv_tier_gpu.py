"""The host tier on a GPU (async scheduling, CUDA graphs, pinned host memory, copies on the stream): a swapped or
host-tier request's greedy output is the one it has without preemption, and weight offload changes no token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from tests.engine.model_factory import make_prompts, save_tiny_model
from tests.engine.quant_support import greedy

pytestmark = pytest.mark.gpu

NEW_TOKENS = 32
GPU = {"device": "cuda", "dtype": "float32", "max_model_len": 400}


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
