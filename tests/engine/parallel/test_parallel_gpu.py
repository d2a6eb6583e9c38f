"""Two GPUs (NCCL): TP=2 and PP=2 engines in float32 are greedy-identical to one GPU, eager and with decode CUDA
graphs capturing the TP all-reduces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.parallel.executor import ParallelExecutor
from tests.engine.model_factory import NEW_TOKENS, make_prompts, save_tiny_model
from tests.engine.quant_support import greedy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]

SETTINGS: dict[str, Any] = {"dtype": "float32", "num_blocks": 512, "long_prefill_token_threshold": 64}


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def gpu_case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[int]]]:
    path = save_tiny_model(request.param, tmp_path_factory.mktemp(f"tp-gpu-{request.param}"))
    return path, greedy(LLMEngine(engine_config(str(path), **SETTINGS)), make_prompts(512), NEW_TOKENS)


@pytest.mark.parametrize(
    "parallel",
    [
        {"tensor_parallel_size": 2, "enforce_eager": True},
        {"tensor_parallel_size": 2},
        {"pipeline_parallel_size": 2},
    ],
    ids=["tp2-eager", "tp2-cuda-graphs", "pp2"],
)
def test_parallel_engine_matches_one_gpu(gpu_case: tuple[Path, list[list[int]]], parallel: dict[str, Any]) -> None:
    path, expected = gpu_case
    engine = LLMEngine(engine_config(str(path), **SETTINGS, **parallel))
    assert isinstance(engine.executor, ParallelExecutor)
    try:
        assert [view.pool.device.index for view in engine.kv_pool_views()] == [0, 1]
        assert greedy(engine, make_prompts(512), NEW_TOKENS) == expected
    finally:
        engine.executor.close()
