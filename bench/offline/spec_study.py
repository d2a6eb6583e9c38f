"""W10, real acceptance: n-gram speculation on a real model (SmolLM2 by default, CPU) over copy-heavy task sets.

1. each task file's prompts go through the model's chat template and are decoded greedily without speculation
   (stopping at EOS or `max_tokens`);
2. `count_acceptance` replays each output with the n-gram proposer at every k asked for, and the figures are
   summed per task: draft and accepted tokens, acceptance rate, mean accepted length, tokens per decode step;
3. given the GPU's step times, the batch-1 speedup each task implies (`implied_speedup`);
4. with `check_engine`, the engine itself decodes every prompt again with n-gram speculation on (the first k, no
   adaptive switch, EOS ignored so both sides stop at `max_tokens`): its tokens must extend the plain greedy ones
   and its SpecStats must equal the counts computed from its output.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from bench.offline.spec_acceptance import (
    IMPLIED_TPOT_FORMULA,
    AcceptanceCounts,
    count_acceptance,
    implied_speedup,
    load_task_set,
)
from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.spec.ngram import NgramProposer


def decode_greedy(engine: LLMEngine, prompts: Sequence[list[int]], params: SamplingParams) -> list[list[int]]:
    """Every prompt's output token ids, all prompts in one batch."""
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    for req_id, prompt in zip(outputs, prompts, strict=True):
        engine.add_request(req_id, prompt, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.req_id] += out.new_token_ids
    return list(outputs.values())


def chat_prompts(model_path: Path, task_dir: Path) -> dict[str, list[list[int]]]:
    """Each task file's prompts (`<task>.txt` -> task), as token ids through the model's chat template."""
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    return {
        path.stem: [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=False
            )
            for prompt in load_task_set(path)
        ]
        for path in sorted(task_dir.glob("*.txt"))
    }


def _total_counts(
    prompts: list[list[int]], outputs: list[list[int]], proposer: NgramProposer, k: int
) -> AcceptanceCounts:
    counts = AcceptanceCounts()
    for prompt, output in zip(prompts, outputs, strict=True):
        counts = counts.plus(count_acceptance(prompt, output, proposer, k))
    return counts


def _check_engine(
    model: str, prompts: list[list[int]], outputs: list[list[int]], proposer: NgramProposer, k: int, max_tokens: int
) -> dict[str, Any]:
    """Step 4 of the module docstring, for one task's prompts."""
    spec = {
        "method": "ngram",
        "num_speculative_tokens": k,
        "prompt_lookup_min": proposer.prompt_lookup_min,
        "prompt_lookup_max": proposer.prompt_lookup_max,
        "min_acceptance": 0.0,
        "disable_by_batch_size": len(prompts) + 1,
    }
    engine = LLMEngine(engine_config(model, speculative_config=spec))
    spec_outputs = decode_greedy(
        engine, prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    )
    counts = _total_counts(prompts, spec_outputs, proposer, k)
    stats = engine.spec_stats
    engine_counts = (stats.draft_tokens, stats.accepted_tokens, stats.verify_steps)
    return {
        "greedy_tokens_equal": all(s[: len(o)] == o for s, o in zip(spec_outputs, outputs, strict=True)),
        "engine_spec_stats": dict(zip(("draft_tokens", "accepted_tokens", "verify_steps"), engine_counts, strict=True)),
        "stats_equal_computed": engine_counts == (counts.draft_tokens, counts.accepted_tokens, counts.verify_steps),
    }


def run_study(
    model: str,
    task_dir: Path,
    ks: Sequence[int],
    max_tokens: int,
    lookup: tuple[int, int],
    step_ms: tuple[float, float] | None,
    check_engine: bool,
) -> dict[str, Any]:
    """The W10 real-acceptance figures (module docstring); `lookup` is (prompt_lookup_min, prompt_lookup_max),
    `step_ms` the GPU's (decode-step, verify-step at k+1 tokens) times in ms."""
    engine = LLMEngine(engine_config(model))
    tasks = chat_prompts(engine.model_path, task_dir)
    proposer = NgramProposer(*lookup)
    result: dict[str, Any] = {"model": engine.info.model_id, "device": engine.info.device, "tasks": {}}
    result |= {"max_tokens": max_tokens, "prompt_lookup_min": lookup[0], "prompt_lookup_max": lookup[1]}
    if step_ms is not None:
        result["implied_tpot"] = {"formula": IMPLIED_TPOT_FORMULA, "decode_step_ms": step_ms[0]}
        result["implied_tpot"]["verify_step_ms"] = step_ms[1]
    for task, prompts in tasks.items():
        outputs = decode_greedy(engine, prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
        figures: dict[str, Any] = {"prompts": len(prompts), "output_tokens": sum(map(len, outputs))}
        for k in ks:
            counts = _total_counts(prompts, outputs, proposer, k)
            figures[f"k{k}"] = counts.figures() | (implied_speedup(counts, *step_ms) if step_ms else {})
        if check_engine:
            figures["engine_check"] = _check_engine(model, prompts, outputs, proposer, ks[0], max_tokens)
        result["tasks"][task] = figures
    return result
