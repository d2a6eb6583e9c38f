"""Async scheduling (step N+1 scheduled before step N's tokens are known) gives the same outputs as sync."""

from __future__ import annotations

from pathlib import Path

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
