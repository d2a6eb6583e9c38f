"""Beam search on a GPU (Triton attention, CUDA graphs, async scheduling, device-side block copies): the beams of
transformers on the same GPU, in float32."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from tests.engine.beam.beam_oracle import engine_beam_search, hf_beam_search, load_hf
from tests.engine.model_factory import save_tiny_model

pytestmark = pytest.mark.gpu

STOP_TOKEN_IDS = list(range(48))


@pytest.mark.parametrize("enforce_eager", [False, True], ids=["cuda-graphs", "eager"])
@pytest.mark.parametrize("width", [2, 8])
def test_beams_match_transformers_on_gpu(tmp_path: Path, enforce_eager: bool, width: int) -> None:
    path = save_tiny_model("qwen3", tmp_path / "qwen3")
    hf = load_hf(path).to("cuda")
    rng = random.Random(3)
    prompts = [[rng.randrange(512) for _ in range(n)] for n in (1, 17, 40, 100)]
    params = SamplingParams(
        n=width, temperature=0.0, max_tokens=12, use_beam_search=True, stop_token_ids=STOP_TOKEN_IDS
    )
    expected = [hf_beam_search(hf, p, params, STOP_TOKEN_IDS) for p in prompts]
    engine = LLMEngine(
        engine_config(
            str(path), device="cuda", dtype="float32", num_blocks=512, max_num_seqs=64, enforce_eager=enforce_eager
        )
    )
    assert engine.async_scheduling
    got = engine_beam_search(engine, prompts, params)
    for result, reference in zip(got, expected, strict=True):
        assert [b.token_ids for b in result] == [b.token_ids for b in reference]
        assert [b.score for b in result] == pytest.approx([b.score for b in reference], abs=1e-4)
    assert engine.kv_cache_manager.num_free_blocks == 512
