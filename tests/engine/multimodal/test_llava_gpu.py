"""Image prompts on a GPU (Triton attention, CUDA graphs for the decode steps, the vision encoder on CUDA): greedy
output identical to transformers on the same device in float32; in bfloat16 the image still decides the output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from tests.engine.multimodal.vlm_factory import (
    NEW_TOKENS,
    greedy_one_by_one,
    hf_llava_greedy,
    image_prompts,
    save_tiny_llava,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def llava_gpu(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, list[list[int]]]:
    folder = save_tiny_llava(tmp_path_factory.mktemp("llava-gpu"))
    prompts = image_prompts()
    cases = [(ids, [i.data for i in images]) for ids, images in prompts]
    return folder, prompts, hf_llava_greedy(folder, cases, NEW_TOKENS, device="cuda")


@pytest.mark.parametrize("enforce_eager", [False, True], ids=["cuda-graphs", "eager"])
@pytest.mark.parametrize("chunk", [None, 7], ids=["unchunked", "chunk-7"])
def test_image_prompts_match_transformers_on_gpu(llava_gpu: Any, enforce_eager: bool, chunk: int | None) -> None:
    folder, prompts, expected = llava_gpu
    kwargs = {"long_prefill_token_threshold": chunk} if chunk else {}
    config = engine_config(
        str(folder), device="cuda", dtype="float32", num_blocks=256, enforce_eager=enforce_eager, **kwargs
    )
    engine = LLMEngine(config)
    assert engine.runner.prompt_embedder is not None
    assert engine.runner.prompt_embedder.encoder.multi_modal_projector.linear_1.weight.is_cuda
    assert greedy_one_by_one(engine, prompts, "a") == expected
    assert greedy_one_by_one(engine, prompts, "b") == expected  # from the prefix cache


def test_bfloat16_image_path_runs(llava_gpu: Any) -> None:
    folder, prompts, _ = llava_gpu
    engine = LLMEngine(engine_config(str(folder), device="cuda", dtype="bfloat16", num_blocks=256))
    outputs = greedy_one_by_one(engine, prompts, "a")
    assert all(len(tokens) == NEW_TOKENS for tokens in outputs)
    assert outputs[0] != outputs[1]  # equal token ids, different images
