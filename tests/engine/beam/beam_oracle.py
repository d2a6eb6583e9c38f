"""transformers' beam search as the oracle, and the engine's beam search run to its end."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from common.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.scheduler_output import BeamSearchOutput


@dataclass(frozen=True)
class BeamResult:
    token_ids: list[int]
    score: float


def load_hf(model_path: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()


@torch.no_grad()
def hf_beam_search(
    model: PreTrainedModel, prompt: list[int], params: SamplingParams, eos_token_ids: list[int]
) -> list[BeamResult]:
    """generate(num_beams=...) of one prompt: each returned beam's generated tokens (up to its EOS) and score."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=params.max_tokens,
        do_sample=False,
        num_beams=params.beam_width,
        num_return_sequences=params.n,
        length_penalty=params.length_penalty,
        early_stopping=params.early_stopping,
        eos_token_id=eos_token_ids,
        pad_token_id=eos_token_ids[0],
        output_scores=True,
        return_dict_in_generate=True,
    )
    results = []
    for row, score in zip(out.sequences.tolist(), out.sequences_scores.tolist(), strict=True):
        generated = row[len(prompt) :]
        end = next((i + 1 for i, t in enumerate(generated) if t in eos_token_ids), len(generated))
        results.append(BeamResult(generated[:end], score))
    return results


def engine_beam_search(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[BeamResult]]:
    """Every prompt's returned beams, all prompts run together."""
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    results: dict[str, list[BeamResult]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert isinstance(out, BeamSearchOutput), out
            results[out.req_id] = [BeamResult(list(b.beam.token_ids), b.score) for b in out.beams]
    return [results[str(i)] for i in range(len(prompts))]
