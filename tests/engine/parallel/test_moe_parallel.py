"""MoE models over two tensor-parallel ranks on CPU (gloo, float32) are greedy token-identical to transformers: with
expert parallelism (each rank holds half the experts whole) and without (each rank holds half of every expert)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.parallel.executor import ParallelExecutor
from tests.engine.model_factory import NEW_TOKENS, hf_greedy, make_prompts, save_tiny_model
from tests.engine.quant_support import greedy

# A pool small enough to preempt, chunks of 3 blocks, prefix caching on (as the dense models' parallel tests).
SETTINGS = {"num_blocks": 48, "max_model_len": 400, "long_prefill_token_threshold": 48}


# NOTE: the tensor-parallel split of the experts is a soak case (two more worker processes, ~7 s on 2 cores): the
# default suite keeps expert parallel, whose ranks load and skip different experts.
@pytest.mark.parametrize(
    ("name", "expert_parallel"),
    [
        pytest.param("qwen3_moe", True, id="qwen3_moe-ep"),
        pytest.param("mixtral", False, id="mixtral-tp", marks=pytest.mark.soak),
    ],
)
def test_moe_over_two_ranks_matches_transformers(tmp_path: Path, name: str, expert_parallel: bool) -> None:
    path = save_tiny_model(name, tmp_path)
    prompts = make_prompts(512)
    expected = hf_greedy(path, prompts, NEW_TOKENS)
    engine = LLMEngine(
        engine_config(str(path), **SETTINGS, tensor_parallel_size=2, enable_expert_parallel=expert_parallel)
    )
    assert isinstance(engine.executor, ParallelExecutor)
    try:
        assert greedy(engine, prompts, NEW_TOKENS) == expected
        assert engine.scheduler.num_preemptions > 0
    finally:
        engine.executor.close()
