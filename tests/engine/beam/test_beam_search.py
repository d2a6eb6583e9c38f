"""Beam search matches transformers' (same beams, order and scores) on a tiny random-weight model in float32."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from transformers import PreTrainedModel

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from tests.engine.beam.beam_oracle import engine_beam_search, hf_beam_search, load_hf
from tests.engine.model_factory import save_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PreTrainedModel]:
    path = save_tiny_model("qwen2", tmp_path_factory.mktemp("beam"))
    return path, load_hf(path)


def _prompts(lengths: list[int]) -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(512) for _ in range(n)] for n in lengths]


def _assert_same(engine_results, hf_results) -> None:
    for got, expected in zip(engine_results, hf_results, strict=True):
        assert [b.token_ids for b in got] == [b.token_ids for b in expected]
        assert [b.score for b in got] == pytest.approx([b.score for b in expected], abs=1e-4)


STOP_TOKEN_IDS = list(range(48))
"""About a tenth of the vocabulary ends a beam: beams finish at every length, not only at max_tokens."""


@pytest.mark.parametrize(
    ("width", "length_penalty", "early_stopping", "lengths"),
    [(2, 1.0, False, [1, 17, 40]), (4, 0.5, True, [33]), (8, 2.0, "never", [16])],
)
def test_beams_match_transformers(
    tiny: tuple[Path, PreTrainedModel],
    width: int,
    length_penalty: float,
    early_stopping: bool | str,
    lengths: list[int],
) -> None:
    path, hf = tiny
    prompts = _prompts(lengths)
    params = SamplingParams(
        n=width,
        temperature=0.0,
        max_tokens=8,
        use_beam_search=True,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        stop_token_ids=STOP_TOKEN_IDS,
    )
    expected = [hf_beam_search(hf, p, params, STOP_TOKEN_IDS) for p in prompts]
    engine = LLMEngine(engine_config(str(path), num_blocks=256))
    _assert_same(engine_beam_search(engine, prompts, params), expected)
    assert engine.kv_cache_manager.num_free_blocks == 256
    if length_penalty <= 1.0:  # a larger one favours long beams: the stopped ones fall behind
        assert any(b.token_ids[-1] in STOP_TOKEN_IDS for result in expected for b in result)
