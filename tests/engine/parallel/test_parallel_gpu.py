"""Two GPUs (NCCL): TP=2 and PP=2 engines in float32 are greedy-identical to one GPU, eager and with decode CUDA
graphs capturing the TP all-reduces; a TP=2 engine with an fp8 KV cache holds each rank's KV heads in fp8."""

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
FP8_KV: dict[str, Any] = {**SETTINGS, "dtype": "bfloat16", "kv_cache_dtype": "fp8"}


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


def _prefix_agreement(expected: list[list[int]], actual: list[list[int]]) -> float:
    """The mean fraction of each continuation that `actual` shares with `expected` before their first difference."""
    shares = []
    for want, got in zip(expected, actual, strict=True):
        same = next((i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b), len(want))
        shares.append(same / len(want))
    return sum(shares) / len(shares)


def test_tp2_fp8_kv_cache_holds_each_ranks_kv_heads(tmp_path: Path) -> None:
    # bf16 (fp8 KV needs a 16-bit model): TP=2 sums in another order than one GPU, so greedy output may part late;
    # a broken fp8 pool or attention read parts at once.
    path = save_tiny_model("qwen3", tmp_path)
    prompts = make_prompts(512)
    expected = greedy(LLMEngine(engine_config(str(path), **FP8_KV)), prompts, NEW_TOKENS)
    engine = LLMEngine(engine_config(str(path), **FP8_KV, tensor_parallel_size=2))
    assert isinstance(engine.executor, ParallelExecutor)
    try:
        pools = [(view.pool.dtype, view.pool.device.index, view.pool.shape[4]) for view in engine.kv_pool_views()]
        assert pools == [(torch.float8_e4m3fn, 0, 1), (torch.float8_e4m3fn, 1, 1)]  # 2 KV heads, one per rank
        agreement = _prefix_agreement(expected, greedy(engine, prompts, NEW_TOKENS))
    finally:
        engine.executor.close()
    print(f"TP=2 vs one GPU, bf16 with fp8 KV: greedy common-prefix agreement {agreement:.3f} (bound >= 0.5)")
    assert agreement >= 0.5
