"""Async scheduling (step N+1 scheduled before step N's tokens are known) gives the same outputs as sync."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.scheduler_output import EngineOutput
from tests.engine.model_factory import make_prompts, save_tiny_model

Outputs = dict[str, tuple[list[int], list[float | None], str | None]]


@pytest.fixture(scope="module")
def qwen3_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3-async"))


def make_engine(path: Path, async_scheduling: bool, **kwargs: int) -> LLMEngine:
    return LLMEngine(
        engine_config(str(path), num_blocks=kwargs.pop("num_blocks", 512), async_scheduling=async_scheduling, **kwargs)
    )


def collect(engine: LLMEngine, outputs: Outputs, step_outputs: list[EngineOutput]) -> None:
    for out in step_outputs:
        tokens, logprobs, _ = outputs.setdefault(out.req_id, ([], [], None))
        tokens.extend(out.new_token_ids)
        logprobs.extend(out.new_logprobs)
        if out.finished:
            outputs[out.req_id] = (tokens, logprobs, out.finish_reason)


def run(engine: LLMEngine, requests: list[tuple[str, list[int], SamplingParams]]) -> Outputs:
    outputs: Outputs = {}
    for req_id, prompt, params in requests:
        engine.add_request(req_id, prompt, params)
    while engine.has_unfinished_requests():
        collect(engine, outputs, engine.step())
    return outputs


def mixed_requests(path: Path) -> list[tuple[str, list[int], SamplingParams]]:
    prompts = make_prompts(vocab_size=512, seed=4)
    greedy = run(make_engine(path, False), [("probe", prompts[9], SamplingParams(temperature=0, max_tokens=12))])
    stop_token = greedy["probe"][0][5]  # stops after 6 tokens (or earlier if the token came sooner)
    return [
        ("greedy", prompts[3], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)),
        ("stop-token", prompts[9], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_token])),
        ("seeded", prompts[10], SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=15, ignore_eos=True)),
        ("logprobs", prompts[12], SamplingParams(temperature=0, max_tokens=9, logprobs=True, ignore_eos=True)),
        ("one-token", prompts[14], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)),
    ]


def test_async_equals_sync_for_mixed_sampling(qwen3_path: Path) -> None:
    requests = mixed_requests(qwen3_path)
    expected = run(make_engine(qwen3_path, False), requests)
    engine = make_engine(qwen3_path, True)
    assert engine.async_scheduling
    actual = run(engine, requests)
    assert actual == expected
    assert expected["stop-token"][2] == "stop" and expected["one-token"][0] and len(expected["one-token"][0]) == 1
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks


def test_penalties_wait_for_the_step_in_flight(qwen3_path: Path) -> None:
    params = SamplingParams(temperature=0, max_tokens=16, repetition_penalty=1.8, frequency_penalty=1.0)
    requests = [("penalized", make_prompts(512, seed=5)[8], params), *mixed_requests(qwen3_path)[:2]]
    assert run(make_engine(qwen3_path, True), requests) == run(make_engine(qwen3_path, False), requests)


def test_aborted_id_reused_at_once_gets_only_its_own_tokens(qwen3_path: Path) -> None:
    prompts = make_prompts(vocab_size=512, seed=6)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    expected = run(make_engine(qwen3_path, False), [("a", prompts[11], params)])
    engine = make_engine(qwen3_path, True)
    engine.add_request("a", prompts[7], params)
    engine.add_request("b", prompts[8], params)
    for _ in range(3):
        engine.step()
    assert engine.abort_requests(["a"])[0].finish_reason == "abort"
    engine.add_request("a", prompts[11], params)  # the old "a" may still be in flight on the device
    outputs: Outputs = {}
    while engine.has_unfinished_requests():
        collect(engine, outputs, engine.step())
    assert outputs["a"] == expected["a"]
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks


def test_outputs_arrive_one_step_later(qwen3_path: Path) -> None:
    prompt = make_prompts(vocab_size=512, seed=7)[5]
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    engine = make_engine(qwen3_path, True)
    engine.add_request("r", prompt, params)
    per_step = []
    while engine.has_unfinished_requests():
        per_step.append([t for out in engine.step() for t in out.new_token_ids])
    # prefill (sampled, in flight), decode 1, decode 2, then nothing left to run: the last token comes alone.
    assert [len(tokens) for tokens in per_step] == [0, 1, 1, 1]


def test_speculation_waits_only_for_steps_that_propose(qwen3_path: Path) -> None:
    """A replay request that leaves its recording after 8 tokens: once its proposer finds nothing, it asks again
    after 2, 4, 8 and 16 steps only, and only those steps wait for the step in flight (the others overlap)."""
    prompt = make_prompts(vocab_size=512, seed=8)[6]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    tokens = run(make_engine(qwen3_path, False), [("r", prompt, params)])["r"][0]
    spec = {"method": "replay", "num_speculative_tokens": 4}
    engine = LLMEngine(engine_config(str(qwen3_path), num_blocks=512, async_scheduling=True, speculative_config=spec))
    engine.set_replay_recordings({tuple(prompt): tokens[:8] + [(t + 1) % 512 for t in tokens[8:]]})
    events: list[str] = []

    def logged(name: str, method: Any) -> Any:
        def call(*args: Any) -> Any:
            events.append(name)
            return method(*args)

        return call

    for name in ("schedule", "update_from_output"):
        setattr(engine.scheduler, name, logged(name, getattr(engine.scheduler, name)))
    engine.add_request("r", prompt, params)
    waited, outputs = [], []
    while engine.has_unfinished_requests():
        events.clear()
        outputs += [t for out in engine.step() for t in out.new_token_ids]
        waited.append(events[0] == "update_from_output")
    assert outputs == tokens
    # Step 1 prefills; 2 and 3 verify o2..o5 (all accepted) and o7, o8, r9 (rejected); 4 asks and misses, then
    # 6, 10, 18 and 34 ask again (34 has no token left to propose, but waits). 35 steps: 6 tokens came as proposals.
    assert [step for step, wait in enumerate(waited, start=1) if wait] == [2, 3, 4, 6, 10, 18, 34]
    assert len(waited) == 35
    assert engine.spec_stats.draft_tokens == 8 and engine.spec_stats.accepted_tokens == 6
