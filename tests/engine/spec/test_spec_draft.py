"""Draft-model speculation is exact: greedy tokens are transformers' own and seeded samples those without speculation,
with the target as its own draft (every proposal accepted) and with a random-weight draft of another architecture
(almost none), across prefix caching, async scheduling, chunked prefill, preemption and a decode pod's prefilled
requests; the pool drains and the draft forgets finished requests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.spec.draft_speculator import DraftSpeculator
from tests.engine.model_factory import NEW_TOKENS, save_tiny_model, step_to_end

TinyModel = tuple[Path, list[list[int]], list[list[int]]]
pytestmark = pytest.mark.parametrize("tiny_model", ["qwen3"], indirect=True)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # NOTE: on the shared 2-core test machine torch's spinning thread pool runs many times slower.
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)


@pytest.fixture(scope="module")
def random_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another architecture, other random weights, the same vocabulary."""
    return save_tiny_model("llama", tmp_path_factory.mktemp("draft-llama"), seed=1)


def draft_spec(model: Path, **fields: Any) -> dict[str, Any]:
    return {"method": "draft_model", "model": str(model), "num_speculative_tokens": 3, **fields}


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    tokens = step_to_end(engine, prompts, params)
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks
    speculator = engine.speculator
    assert isinstance(speculator, DraftSpeculator) and not speculator.draft._states
    return tokens


GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.mark.parametrize(
    "engine_args",
    [
        {"num_blocks": 512, "async_scheduling": True},
        {"num_blocks": 32, "enable_prefix_caching": False},
    ],
    ids=["prefix-cache-async", "preempted"],
)
def test_greedy_self_draft_accepts_everything(tiny_model: TinyModel, engine_args: dict[str, Any]) -> None:
    path, prompts, expected = tiny_model
    prompts, expected = prompts[::2], expected[::2]
    engine = LLMEngine(engine_config(str(path), speculative_config=draft_spec(path), **engine_args))
    assert run(engine, prompts, GREEDY) == expected
    stats = engine.spec_stats
    assert stats.draft_tokens > 100 and stats.accepted_tokens == stats.draft_tokens
    if engine_args["num_blocks"] == 32:
        assert engine.scheduler.num_preemptions > 0


def test_greedy_random_draft_chunked(tiny_model: TinyModel, random_draft: Path) -> None:
    """The draft's catch-up prefill in chunks of max_num_batched_tokens (40), the target's prompts in chunks of 24."""
    path, prompts, expected = tiny_model
    prompts, expected = prompts[1::4], expected[1::4]
    spec = draft_spec(random_draft, probe_interval=2)
    config = engine_config(
        str(path), num_blocks=512, max_num_batched_tokens=40, long_prefill_token_threshold=24, speculative_config=spec
    )
    engine = LLMEngine(config)
    assert run(engine, prompts, GREEDY) == expected
    stats = engine.spec_stats
    assert stats.draft_tokens > 50 and stats.accepted_tokens < 0.1 * stats.draft_tokens


def test_seeded_sampling_equals_without_speculation(tiny_model: TinyModel, random_draft: Path) -> None:
    """The draft samples with the target's (seed, position) draws: the target as its own draft then proposes the
    very tokens the target samples, seeded or not (without penalties: the draft's steps do not see its own earlier
    proposals among the output tokens)."""
    path, prompts, _ = tiny_model
    prompts = prompts[4:8]
    params = [
        SamplingParams(temperature=0.8, seed=11, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=8, repetition_penalty=1.3, seed=12, max_tokens=12, ignore_eos=True),
    ]
    for p in params:
        off = step_to_end(LLMEngine(engine_config(str(path), num_blocks=256)), prompts, p)
        for draft in (path, random_draft):
            engine = LLMEngine(engine_config(str(path), num_blocks=256, speculative_config=draft_spec(draft)))
            assert run(engine, prompts, p) == off
            stats = engine.spec_stats
            assert stats.draft_tokens > 0
            if draft == path and not p.has_penalty:
                assert stats.accepted_tokens == stats.draft_tokens
    unseeded = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    engine = LLMEngine(engine_config(str(path), num_blocks=256, speculative_config=draft_spec(path)))
    run(engine, prompts, unseeded)
    assert engine.spec_stats.accepted_tokens == engine.spec_stats.draft_tokens > 0


def test_decode_pod_request_drafts_from_its_prompt(tiny_model: TinyModel) -> None:
    """A prefilled request (prompt KV copied into reserved blocks, first token sampled elsewhere): the draft
    prefills the prompt itself on its first round, and accepts everything as its own draft."""
    path, prompts, expected = tiny_model
    prompt, want = prompts[13], expected[13]
    prefill = LLMEngine(engine_config(str(path), num_blocks=64))
    prefill.add_request("p", prompt, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True), hold_kv=True)
    (first,) = [t for _ in range(3) for o in prefill.step() for t in o.new_token_ids]
    progress = prefill.kv_progress("p")
    assert progress is not None
    source_blocks, _ = progress
    decode = LLMEngine(engine_config(str(path), num_blocks=64, speculative_config=draft_spec(path)))
    reserved = decode.reserve_kv("d", len(prompt))
    assert reserved is not None
    decode.runner.kv_cache[reserved] = prefill.runner.kv_cache[source_blocks]
    decode.add_prefilled_request("d", prompt, first, GREEDY)
    tokens = [first]
    while decode.has_unfinished_requests():
        tokens += [t for o in decode.step() for t in o.new_token_ids]
    assert tokens == want
    assert decode.spec_stats.accepted_tokens == decode.spec_stats.draft_tokens > 0
    assert decode.kv_cache_manager.num_free_blocks == decode.runner.num_blocks


def test_abort_forgets_the_request(tiny_model: TinyModel) -> None:
    path, prompts, _ = tiny_model
    engine = LLMEngine(engine_config(str(path), num_blocks=128, speculative_config=draft_spec(path)))
    for i, prompt in enumerate(prompts[2:5]):
        engine.add_request(str(i), prompt, GREEDY)
    for _ in range(4):
        engine.step()
    speculator = engine.speculator
    assert isinstance(speculator, DraftSpeculator)
    assert set(speculator.draft._states) == {"0", "1", "2"}
    engine.abort_requests(["1"])
    assert set(speculator.draft._states) == {"0", "2"}
    while engine.has_unfinished_requests():
        engine.step()
    assert not speculator.draft._states
    assert not speculator.draft.runner.input_batch._rows.keys() - {"0", "2"}
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks
