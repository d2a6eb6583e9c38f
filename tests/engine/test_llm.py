"""The offline API on the packaged SmolLM2: generation, stop strings, n, seeds, streaming, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import InvalidArgumentError
from engine import LLM, SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine


@pytest.fixture(scope="module")
def llm(smollm2_path: Path) -> LLM:
    return LLM(str(smollm2_path), num_blocks=512, max_model_len=512)


def test_greedy_paris(llm: LLM) -> None:
    out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert out[0].outputs[0].text.startswith(" Paris")
    assert out[0].outputs[0].finish_reason == "length"


def test_stop_string_spanning_tokens_is_cut_and_excluded(llm: LLM) -> None:
    prompt = "Write the alphabet in words: apple, banana, cherry,"
    greedy = SamplingParams(temperature=0, max_tokens=24)
    full = llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0]
    tokenizer = llm.tokenizer
    pieces = [tokenizer.decode(full.token_ids[: i + 1]) for i in range(len(full.token_ids))]
    # A stop string made of the end of token 3's text and the start of token 4's text.
    boundary = len(pieces[3])
    stop = full.text[boundary - 2 : boundary + 2]
    assert len(stop) == 4 and stop.strip()
    first = full.text.find(stop)
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24, stop=[stop]), use_tqdm=False)[0]
    completion = out.outputs[0]
    assert completion.text == full.text[:first]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop)
    kept = llm.generate(
        prompt,
        SamplingParams(temperature=0, max_tokens=24, stop=[stop], include_stop_str_in_output=True),
        use_tqdm=False,
    )[0]
    assert kept.outputs[0].text == full.text[: first + len(stop)]


def test_n_completions_with_seed_are_reproducible(llm: LLM) -> None:
    params = SamplingParams(n=3, temperature=1.0, top_p=0.9, seed=1234, max_tokens=12, logprobs=True)
    first = llm.generate(["Once upon a time", "Hello"], params, use_tqdm=False)
    again = llm.generate(["Hello", "Once upon a time"], params, use_tqdm=False)
    assert [c.token_ids for c in first[0].outputs] == [c.token_ids for c in again[1].outputs]
    assert [c.index for c in first[0].outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in first[0].outputs}) > 1
    assert all(len(c.logprobs or []) == len(c.token_ids) for c in first[0].outputs)
    assert all(lp <= 0.0 for lp in first[0].outputs[0].logprobs or [])


def test_stream_yields_growing_outputs(llm: LLM) -> None:
    seen = [o.outputs[0].token_ids[:] for o in llm.stream("Hi", SamplingParams(temperature=0, max_tokens=5))]
    assert [len(t) for t in seen] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("make", "field", "text"),
    [
        (lambda: SamplingParams(temperature=-0.5), "temperature", ">= 0"),
        (lambda: SamplingParams(top_p=0.0), "top_p", "(0, 1]"),
        (lambda: SamplingParams(top_p=1.5), "top_p", "(0, 1]"),
        (lambda: SamplingParams(top_k=0), "top_k", ">= 1"),
        (lambda: SamplingParams(top_k=-2), "top_k", "-1"),
        (lambda: SamplingParams(n=0), "n", ">= 1"),
        (lambda: SamplingParams(max_tokens=0), "max_tokens", ">= 1"),
    ],
)
def test_bad_sampling_params_name_field_and_limit(make, field: str, text: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgumentError) as err:
        make()
    assert err.value.field == field
    assert text in str(err.value)


def test_bad_prompts_are_rejected_before_anything_runs(llm: LLM) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        llm.generate(["fine", ""], SamplingParams(max_tokens=2), use_tqdm=False)
    assert err.value.field == "prompt"
    with pytest.raises(InvalidArgumentError) as err:
        llm.generate("fine", SamplingParams(max_tokens=600), use_tqdm=False)
    assert err.value.field == "max_tokens"
    assert "512" in str(err.value) and "600" in str(err.value)
    assert not llm.engine.has_unfinished_requests()


def test_unknown_model_path_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        LLM(str(tmp_path / "nope"))
    assert err.value.field == "model"
    assert "nope" in str(err.value)


def test_seeded_sampling_independent_of_batch(tiny_model: tuple[Path, list[list[int]], list[list[int]]]) -> None:
    path, prompts, _ = tiny_model
    params = SamplingParams(temperature=0.8, top_k=50, seed=7, max_tokens=16, ignore_eos=True)

    def run(batch: list[list[int]]) -> list[int]:
        engine = LLMEngine(engine_config(str(path), num_blocks=512))
        engine.add_request("target", prompts[5], params)
        for i, prompt in enumerate(batch):
            engine.add_request(f"other-{i}", prompt, SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True))
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            tokens += [t for o in engine.step() if o.req_id == "target" for t in o.new_token_ids]
        return tokens

    alone = run([])
    assert run(prompts[:3]) == alone
    assert run(prompts[8:14]) == alone


def test_request_joins_mid_decode_and_pool_drains(tiny_model: tuple[Path, list[list[int]], list[list[int]]]) -> None:
    path, prompts, _ = tiny_model
    engine = LLMEngine(engine_config(str(path), num_blocks=256))
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    engine.add_request("a", prompts[9], params)
    engine.add_request("b", prompts[10], params)
    for _ in range(5):
        engine.step()
    engine.add_request("late", prompts[12], params)
    steps_until_token = next(i for i in range(1, 10) if any(o.req_id == "late" for o in engine.step()))
    assert steps_until_token == 1
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks
