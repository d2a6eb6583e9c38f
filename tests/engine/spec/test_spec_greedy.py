"""Speculative decoding is exact under greedy decoding: the tokens are transformers' own, whatever the proposals.

Each case runs the 16 mixed-length prompts (a shared 64-token prefix among them) with the replay proposer at 0%,
30% and 100% corruption or the n-gram proposer, across prefix caching on/off, chunked prefill, a pool small enough
to force preemption, and async scheduling; the block pool must be fully free after every run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.scheduler_output import SchedulerOutput
from tests.engine.model_factory import NEW_TOKENS

TinyModel = tuple[Path, list[list[int]], list[list[int]]]

CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "replay30-prefix-cache-async": (
        {"method": "replay", "replay_corruption": 0.3},
        {"num_blocks": 512, "async_scheduling": True},
    ),
    "replay0-no-prefix-cache-chunked": (
        {"method": "replay", "replay_corruption": 0.0, "num_speculative_tokens": 5},
        {"num_blocks": 512, "enable_prefix_caching": False, "long_prefill_token_threshold": 48},
    ),
    "replay100-preempted": (
        {"method": "replay", "replay_corruption": 1.0, "probe_interval": 2},
        {"num_blocks": 64, "block_size": 16},
    ),
    "ngram-chunked": (
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
        {"num_blocks": 512, "long_prefill_token_threshold": 64},
    ),
}


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> dict[str, list[int]]:
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens[output.req_id] += output.new_token_ids
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks
    return tokens


@pytest.mark.parametrize("case", ["replay30-prefix-cache-async", "ngram-chunked"])
def test_greedy_tokens_equal_transformers(tiny_model: TinyModel, case: str) -> None:
    check_greedy(tiny_model, case)


@pytest.mark.parametrize("tiny_model", ["qwen3"], indirect=True)
@pytest.mark.parametrize("case", ["replay0-no-prefix-cache-chunked", "replay100-preempted"])
def test_greedy_tokens_equal_transformers_qwen3(tiny_model: TinyModel, case: str) -> None:
    """The cases that exercise the scheduler more than the model: on one architecture."""
    check_greedy(tiny_model, case)


def check_greedy(tiny_model: TinyModel, case: str) -> None:
    path, prompts, expected = tiny_model
    speculative, engine_args = CASES[case]
    engine = LLMEngine(engine_config(str(path), speculative_config=speculative, **engine_args))
    if speculative["method"] == "replay":
        engine.set_replay_recordings({tuple(p): e for p, e in zip(prompts, expected, strict=True)})
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    tokens = run(engine, prompts, params)
    assert [tokens[str(i)] for i in range(len(prompts))] == expected
    stats = engine.spec_stats
    assert stats.draft_tokens > 0
    corruption = speculative.get("replay_corruption")
    if corruption == 0.0:
        assert stats.accepted_tokens == stats.draft_tokens
    if corruption == 1.0:
        assert stats.accepted_tokens == 0
        assert engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("tiny_model", ["qwen3"], indirect=True)
def test_verify_steps_in_the_cuda_graph_layout_give_the_same_tokens(
    tiny_model: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verify steps laid out as their CUDA graphs replay them (each request padded to k + 1 tokens, the padding
    writing no KV), run eagerly on the CPU: the same tokens."""
    path, prompts, expected = tiny_model
    spec = {"method": "replay", "replay_corruption": 0.3, "num_speculative_tokens": 3}
    engine = LLMEngine(engine_config(str(path), num_blocks=512, speculative_config=spec))
    engine.set_replay_recordings({tuple(p): e for p, e in zip(prompts, expected, strict=True)})
    input_batch = engine.runner.input_batch
    prepare = input_batch.prepare
    num_padded_steps = 0

    def prepare_padded(scheduler_output: SchedulerOutput, graph_bs: int | None, previous: Any, _: int = 1) -> Any:
        nonlocal num_padded_steps
        scheduled = scheduler_output.scheduled
        verify = any(r.draft_token_ids for r in scheduled) and all(
            r.sample and len(r.token_ids) == 1 + len(r.draft_token_ids) for r in scheduled
        )
        num_padded_steps += verify
        return prepare(scheduler_output, graph_bs, previous, 4 if verify else 1)

    monkeypatch.setattr(input_batch, "prepare", prepare_padded)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    tokens = run(engine, prompts, params)
    assert [tokens[str(i)] for i in range(len(prompts))] == expected
    assert num_padded_steps > 5
