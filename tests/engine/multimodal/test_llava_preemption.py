"""Preemption with image prompts in the batch, on a random-weight LLaVA (CPU, float32): no path computes an image's
placeholders without the image. Offline (the images are here) a preempted image prompt is recomputed with them; on a
decode pod (the images stayed on the prefill pod) it is swapped out, or it ends with RESOURCE_EXHAUSTED while text
requests are preempted in its place. Every request that finishes gives the unpreempted run's greedy tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.errors import ResourceExhaustedError
from common.multimodal import ImageInput
from common.sampling_params import SamplingParams
from engine.core.commands import AddPrefilledRequest, AddRequest, ReserveKV
from engine.core.engine_core import EngineCore
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.scheduler_output import EngineOutput, FailedOutput
from kv_transfer.in_process import InProcessReceiver, InProcessSender
from kv_transfer.target import KVTarget
from tests.engine.core.core_support import drive, finish_of, tokens_of
from tests.engine.multimodal.vlm_factory import image_prompts, save_tiny_llava

NEW_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
Prompt = tuple[list[int], list[ImageInput]]


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Prompt], list[list[int]]]:
    """The checkpoint, three image prompts and a text one, and their unpreempted greedy tokens."""
    folder = save_tiny_llava(tmp_path_factory.mktemp("llava"))
    prompts = image_prompts()
    chosen = [prompts[0], prompts[1], prompts[3], prompts[5]]
    engine = LLMEngine(engine_config(str(folder), num_blocks=256))
    expected = list(run(engine, chosen).values())
    assert engine.scheduler.num_preemptions == 0
    assert expected[0] != expected[1]  # equal token ids, different images
    return folder, chosen, expected


def run(engine: LLMEngine, prompts: list[Prompt]) -> dict[str, list[int]]:
    for i, (ids, images) in enumerate(prompts):
        engine.add_request(str(i), ids, GREEDY, images=images)
    return drain(engine, {str(i): [] for i in range(len(prompts))})


def drain(engine: LLMEngine, tokens: dict[str, list[int]]) -> dict[str, Any]:
    """Step to the end; each request's tokens, or the FailedOutput that ended it."""
    ends: dict[str, Any] = dict(tokens)
    while engine.has_unfinished_requests():
        outputs: list[EngineOutput] = engine.step()
        for output in outputs:
            if isinstance(output, FailedOutput):
                ends[output.req_id] = output
            else:
                tokens[output.req_id] += output.new_token_ids
    return ends


def spy_victims(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the requests the engine's scheduler preempts, in order."""
    victims: list[str] = []
    preempt = engine.scheduler._preempt

    def spy(request: Any) -> None:
        victims.append(request.req_id)
        preempt(request)

    monkeypatch.setattr(engine.scheduler, "_preempt", spy)
    return victims


# Admitted as: two images (44 tokens), text (33), image A (36), image B (36): fcfs preemption would pick B, then A,
# then the text, and the two-image prompt is the first to need a block (at its 4th new token).
ORDER = [2, 3, 0, 1]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_offline_recompute_encodes_the_images_again(
    llava: Any, async_scheduling: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No prefix cache: a preempted image prompt is recomputed from its first token, its images encoded again."""
    folder, prompts, expected = llava
    engine = LLMEngine(
        engine_config(str(folder), num_blocks=9, enable_prefix_caching=False, async_scheduling=async_scheduling)
    )
    victims = spy_victims(engine, monkeypatch)
    tokens = run(engine, [prompts[i] for i in ORDER])
    assert {ORDER[int(req_id)]: t for req_id, t in tokens.items()} == dict(enumerate(expected))
    assert victims == ["2"]  # image A


def test_offline_swap_in_finds_only_the_images_blocks(llava: Any) -> None:
    """A swapped-out image prompt's readmission looks its prefix up keyed by its images: text prompts that spell the
    same token ids (their blocks cached under the plain ids, placeholder embeddings in their KV) are no hit."""
    folder, prompts, expected = llava
    engine = LLMEngine(engine_config(str(folder), num_blocks=10, swap_space=1 / 1024, swap_min_tokens=0))
    for i in (0, 2):
        engine.add_request(f"text{i}", prompts[i][0], GREEDY)
    drain(engine, {"text0": [], "text2": []})
    tokens = run(engine, [prompts[i] for i in ORDER])
    assert {ORDER[int(req_id)]: t for req_id, t in tokens.items()} == dict(enumerate(expected))
    swapper = engine.scheduler.swapper
    assert swapper is not None and swapper.num_swapped_out == 1


def prefill_then_decode(folder: Path, prompts: list[Prompt], decode: LLMEngine) -> dict[str, list[int]]:
    """Each prompt prefilled on its own engine (images included, first token sampled there), its KV copied into
    blocks the decode engine reserved, then admitted there as a prefilled request (request ids "0", "1", ...)."""
    prefill = LLMEngine(engine_config(str(folder), num_blocks=64))
    first_tokens: dict[str, list[int]] = {}
    for i, (ids, images) in enumerate(prompts):
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        prefill.add_request(f"p{i}", ids, params, hold_kv=True, images=images)
        first_tokens[str(i)] = [t for t in drain(prefill, {f"p{i}": []})[f"p{i}"]]
        progress = prefill.kv_progress(f"p{i}")
        assert progress is not None
        reserved = decode.reserve_kv(str(i), len(ids))
        assert reserved is not None
        decode.runner.kv_cache[reserved] = prefill.runner.kv_cache[progress[0]]
        prefill.release_kv(f"p{i}")
    for i, (ids, _) in enumerate(prompts):
        decode.add_prefilled_request(str(i), ids, first_tokens[str(i)][0], GREEDY)
    return first_tokens


def test_decode_pod_swaps_image_prompts_out(llava: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode pod with a host tier swaps image prompts out whatever their length (swap_min_tokens is for requests
    it may recompute), and brings their KV back: every request gives its unpreempted tokens."""
    folder, prompts, expected = llava
    decode = LLMEngine(engine_config(str(folder), num_blocks=12, swap_space=1 / 1024, swap_min_tokens=10_000))
    victims = spy_victims(decode, monkeypatch)
    tokens = drain(decode, prefill_then_decode(folder, [prompts[i] for i in ORDER], decode))
    assert {ORDER[int(req_id)]: t for req_id, t in tokens.items()} == dict(enumerate(expected))
    assert victims == ["3", "2"]  # images B and A, in fcfs order
    swapper = decode.scheduler.swapper
    assert swapper is not None and swapper.num_swapped_in == swapper.num_swapped_out == 2
    assert decode.kv_cache_manager.num_free_blocks == 12


def test_decode_pod_never_recomputes_an_image_prompt(llava: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No host tier: the text request is preempted (and recomputed) in place of the newer image prompts; the image
    prompt that still finds no room ends with RESOURCE_EXHAUSTED instead of being recomputed without its image."""
    folder, prompts, expected = llava
    decode = LLMEngine(engine_config(str(folder), num_blocks=12))
    victims = spy_victims(decode, monkeypatch)
    ends = drain(decode, prefill_then_decode(folder, [prompts[i] for i in ORDER], decode))
    by_prompt = {ORDER[int(req_id)]: end for req_id, end in ends.items()}
    assert victims == ["1"]  # the text request, passing over images B and A
    failed = {i for i, end in by_prompt.items() if isinstance(end, FailedOutput)}
    assert failed == {1}  # image B, once only images were left to make room
    error = by_prompt[1].error
    assert isinstance(error, ResourceExhaustedError) and "prefill it again" in str(error)
    assert {i: end for i, end in by_prompt.items() if i not in failed} == {i: expected[i] for i in (0, 2, 3)}
    assert decode.kv_cache_manager.num_free_blocks == 12


def test_beam_search_keeps_the_images(llava: Any) -> None:
    """Beams are requests of their own: each carries the prompt's images (the first computes the prompt with them,
    and a beam recomputed after preemption needs them too). Width 1 is greedy: the unpreempted tokens."""
    folder, prompts, expected = llava
    engine = LLMEngine(engine_config(str(folder), num_blocks=64))
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, use_beam_search=True, n=1)
    for i in (0, 1):
        ids, images = prompts[i]
        engine.add_request(str(i), ids, params, images=images)
    tokens = drain(engine, {"0": [], "1": []})
    assert [tokens["0"], tokens["1"]] == expected[:2]


def test_decode_core_reports_the_ended_image_prompt_as_resource_exhausted(llava: Any) -> None:
    """Through the engine cores (in-process KV transfer): two image prompts fill a decode pool of 7 blocks; the newer
    one fails with an exhausted error (RESOURCE_EXHAUSTED at the pod's boundary), the other decodes on."""
    folder, prompts, expected = llava
    prefill_engine = LLMEngine(engine_config(str(folder), num_blocks=64))
    decode_engine = LLMEngine(engine_config(str(folder), num_blocks=7))
    receiver = InProcessReceiver(decode_engine.runner.kv_cache, 16)
    prefill = EngineCore(prefill_engine, sender=InProcessSender(prefill_engine.runner.kv_cache, 16))
    decode = EngineCore(decode_engine, receiver=receiver)
    first_params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    turns = []
    try:
        for req_id, (ids, images) in zip("ab", prompts[:2], strict=True):
            decode.apply(ReserveKV(req_id, len(ids), 30.0))
            turns.append(decode.turn())
            (reply,) = turns[-1].replies
            assert reply.block_ids is not None
            target = KVTarget(req_id, "in_process", receiver.endpoint, reply.block_ids, receiver.layout, 30.0)
            prefill.apply(AddRequest(req_id, ids, first_params, target, keepalive_s=10.0, images=tuple(images)))
            outputs = drive(prefill, lambda outs, r=req_id: any(e.req_id == r for o in outs for e in o.transfers_ended))
            decode.apply(AddPrefilledRequest(req_id, ids, tokens_of(outputs, req_id)[0], GREEDY))
        outputs = turns + drive(decode, lambda outs: finish_of(outs, "a") is not None)
        failures = [f for out in outputs for f in out.failures]
        assert [(f.req_id, f.error.exhausted) for f in failures] == [("b", True)]
        assert isinstance(failures[0].error.to_error(), ResourceExhaustedError)
        assert tokens_of(outputs, "b") == expected[1][1:13]  # what it streamed before the pool ran out
        assert tokens_of(outputs, "a") == expected[0][1:]
        assert outputs[-1].load.num_free_blocks == 7
    finally:
        prefill.close()
        decode.close()


@pytest.mark.parametrize(("num_blocks", "ended_by_scheduler"), [(3, []), (4, ["d#beam1"])])
def test_decode_pod_beam_search_over_an_image_prompt_ends_whole(
    llava: Any, num_blocks: int, ended_by_scheduler: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode pod's beams over an image prompt cannot be recomputed either: with no block for a beam's copy on
    write (3 blocks: the prompt's own; the beam search ends it) or for the beams' growth (4: the scheduler ends the
    newest beam), the whole request ends with one FailedOutput under its own id, and every block comes back."""
    folder, prompts, _ = llava
    ids, images = prompts[0]
    prefill = LLMEngine(engine_config(str(folder), num_blocks=64))
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    prefill.add_request("p", ids, params, hold_kv=True, images=images)
    drain(prefill, {"p": []})
    progress = prefill.kv_progress("p")
    assert progress is not None
    decode = LLMEngine(engine_config(str(folder), num_blocks=num_blocks))
    reserved = decode.reserve_kv("d", len(ids))
    assert reserved is not None
    decode.runner.kv_cache[reserved] = prefill.runner.kv_cache[progress[0]]
    max_tokens = min(NEW_TOKENS, num_blocks * 16 - len(ids))  # within the pool's max_model_len
    beams = SamplingParams(temperature=0.0, max_tokens=max_tokens, use_beam_search=True, n=2)
    ended: list[str] = []
    fail = decode.scheduler._fail_unrecomputable

    def spy(request: Any) -> None:
        ended.append(request.req_id)
        fail(request)

    monkeypatch.setattr(decode.scheduler, "_fail_unrecomputable", spy)
    decode.add_prefilled_request("d", ids, 0, beams)
    ends = drain(decode, {"d": []})
    assert ended == ended_by_scheduler
    assert isinstance(ends["d"], FailedOutput) and isinstance(ends["d"].error, ResourceExhaustedError)
    assert set(ends) == {"d"} and "d" not in decode.beams
    assert decode.kv_cache_manager.num_free_blocks == num_blocks
