"""Tensor- and pipeline-parallel engines on CPU (gloo, float32) are greedy-identical to the single-device engine,
and a dead worker fails the engine's next step at once instead of hanging it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.errors import InvalidArgumentError
from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.parallel.executor import ParallelExecutor, WorkerDiedError
from kv_transfer.layout import KVRank
from tests.engine.model_factory import NEW_TOKENS, make_prompts, save_tiny_model
from tests.engine.quant_support import greedy

# A pool small enough to preempt (16 prompts of up to 332 tokens), chunks of 3 blocks, prefix caching on.
SETTINGS: dict[str, Any] = {"num_blocks": 48, "max_model_len": 400, "long_prefill_token_threshold": 48}


@pytest.fixture(scope="module")
def tiny_case(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Path, list[list[int]]]]]:
    """Per architecture: (folder, the single-device engine's greedy outputs over make_prompts)."""
    cases = {}
    for name in ("llama", "qwen3"):
        path = save_tiny_model(name, tmp_path_factory.mktemp(name))
        cases[name] = (path, greedy(LLMEngine(engine_config(str(path), **SETTINGS)), make_prompts(512), NEW_TOKENS))
    yield cases


def _parallel_engine(path: Path, **parallel: int) -> tuple[LLMEngine, ParallelExecutor]:
    engine = LLMEngine(engine_config(str(path), **SETTINGS, **parallel))
    assert isinstance(engine.executor, ParallelExecutor)
    return engine, engine.executor


def test_pipeline_parallel_qwen3_matches_one_device(tiny_case: dict[str, tuple[Path, list[list[int]]]]) -> None:
    path, expected = tiny_case["qwen3"]
    engine, executor = _parallel_engine(path, pipeline_parallel_size=2)
    try:
        assert greedy(engine, make_prompts(512), NEW_TOKENS) == expected
        assert engine.scheduler.num_preemptions > 0
        # Each stage's pool holds its one layer.
        assert [tuple(view.pool.shape[1:3]) for view in engine.kv_pool_views()] == [(1, 2), (1, 2)]
    finally:
        executor.close()


def test_tensor_parallel_llama_matches_one_device_and_dies_cleanly(
    tiny_case: dict[str, tuple[Path, list[list[int]]]],
) -> None:
    path, expected = tiny_case["llama"]
    engine, executor = _parallel_engine(path, tensor_parallel_size=2)
    try:
        assert greedy(engine, make_prompts(512), NEW_TOKENS) == expected
        # Each rank's pool holds its one of the two KV heads, and the engine reads what the workers wrote.
        views = engine.kv_pool_views()
        assert [(view.rank, view.pool.shape[4]) for view in views] == [(KVRank(0, 2), 1), (KVRank(1, 2), 1)]
        assert all(view.pool.abs().sum() > 0 for view in views)
        os.kill(executor.processes[1].pid or 0, signal.SIGKILL)
        engine.add_request("after-kill", [1, 2, 3], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        started = time.monotonic()
        with pytest.raises(WorkerDiedError, match=r"worker rank\(s\) \[1\] exited"):
            while engine.has_unfinished_requests():
                engine.step()
        assert time.monotonic() - started < 10
        assert not any(p.is_alive() for p in executor.processes)
    finally:
        executor.close()


def test_tensor_and_pipeline_parallel_together_match_one_device(
    tiny_case: dict[str, tuple[Path, list[list[int]]]],
) -> None:
    """TP=2 x PP=2: four workers, two TP groups, stage sends between same-TP-rank peers."""
    path, expected = tiny_case["llama"]
    engine, executor = _parallel_engine(path, tensor_parallel_size=2, pipeline_parallel_size=2)
    try:
        assert greedy(engine, make_prompts(512), NEW_TOKENS) == expected
    finally:
        executor.close()


# NOTE: a soak case (~30 s on 2 cores): the tiny models' tensor- and pipeline-parallel cases stay in the default suite.
@pytest.mark.soak
@pytest.mark.timeout(600)
def test_tensor_parallel_3_on_smollm2_matches_one_device(smollm2_path: Path) -> None:
    """SmolLM2-135M: 9 heads and 3 KV heads over 3 ranks (one KV head each), 16 prompts x 32 tokens."""
    prompts = make_prompts(vocab_size=49152, seed=1)
    settings = {"num_blocks": 1024, "long_prefill_token_threshold": 128}
    expected = greedy(LLMEngine(engine_config(str(smollm2_path), **settings)), prompts, NEW_TOKENS)
    engine = LLMEngine(engine_config(str(smollm2_path), **settings, tensor_parallel_size=3))
    assert isinstance(engine.executor, ParallelExecutor)
    try:
        assert greedy(engine, prompts, NEW_TOKENS) == expected
    finally:
        engine.executor.close()


def test_tensor_parallel_2_on_smollm2_fails_at_start_up(smollm2_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="num_attention_heads 9 is not divisible by tensor_parallel_size 2"):
        LLMEngine(engine_config(str(smollm2_path), tensor_parallel_size=2))
