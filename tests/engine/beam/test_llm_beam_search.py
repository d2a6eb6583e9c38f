"""The offline API: best_of and beam search outputs (OutputProcessor), and beam search on the packaged SmolLM2 as
transformers does it (soak: loading both models costs more than the default run allows)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from engine import LLM, SamplingParams
from engine.beam.beam_scorer import Beam
from engine.output_processor import OutputProcessor
from engine.scheduler_output import BeamSearchOutput, EngineOutput, FinishedBeam
from tests.engine.beam.beam_oracle import hf_beam_search, load_hf


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(smollm2_path))


def test_best_of_returns_the_n_most_likely_samples(tokenizer: PreTrainedTokenizerBase) -> None:
    processor = OutputProcessor(tokenizer)
    children = processor.add_request("r", None, [1, 2], SamplingParams(n=2, best_of=3, seed=5))
    assert [(child_id, p.n, p.best_of, p.seed, p.logprobs) for child_id, p in children] == [
        ("r-0", 1, None, 5, True),
        ("r-1", 1, None, 6, True),
        ("r-2", 1, None, 7, True),
    ]
    ends = [EngineOutput(f"r-{i}", [100 + i], [lp], "length", None, 2, 0) for i, lp in enumerate([-1.0, -0.2, -0.5])]
    assert processor.process(ends[:2]) == ([], [])
    (out,), _ = processor.process(ends[2:])
    assert [(c.index, c.token_ids, c.cumulative_logprob, c.logprobs) for c in out.outputs] == [
        (0, [101], -0.2, None),
        (1, [102], -0.5, None),
    ]


def test_beam_search_output_lists_the_beams(tokenizer: PreTrainedTokenizerBase) -> None:
    processor = OutputProcessor(tokenizer)
    params = SamplingParams(n=2, temperature=0.0, use_beam_search=True, logprobs=True)
    assert processor.add_request("r", None, [1, 2], params) == [("r", params)]
    hello, world = tokenizer.encode(" hello"), tokenizer.encode(" world")
    beams = [
        FinishedBeam(Beam(tuple(hello), (-0.5,) * len(hello), -0.5 * len(hello)), -0.5, "length", None),
        FinishedBeam(Beam(tuple(world), (-0.7,) * len(world), -0.7 * len(world)), -0.7, "stop", world[-1]),
    ]
    end = BeamSearchOutput("r", list(hello), [-0.5], "length", None, 2, 0, beams)
    (out,), to_abort = processor.process([end])
    assert not to_abort and out.finished
    assert [(c.index, c.text, c.finish_reason) for c in out.outputs] == [(0, " hello", "length"), (1, " world", "stop")]
    assert out.outputs[1].logprobs == [-0.7] * len(world)


@pytest.mark.soak
def test_beam_search_matches_transformers_on_smollm2(smollm2_path: Path) -> None:
    llm = LLM(str(smollm2_path), num_blocks=128, max_model_len=256)
    prompt = llm.tokenizer.encode("The three primary colours are")
    params = SamplingParams(n=2, best_of=3, temperature=0.0, max_tokens=6, use_beam_search=True, length_penalty=0.8)
    (out,) = llm.generate([prompt], params, use_tqdm=False)
    expected = hf_beam_search(load_hf(llm.engine.model_path), prompt, params, list(llm.engine.info.eos_token_ids))
    assert [c.token_ids for c in out.outputs] == [b.token_ids for b in expected]
    scores = [(c.cumulative_logprob or 0.0) / len(c.token_ids) ** 0.8 for c in out.outputs]
    assert scores == pytest.approx([b.score for b in expected], abs=1e-4)
    assert out.outputs[0].text == llm.tokenizer.decode(out.outputs[0].token_ids, skip_special_tokens=True)
