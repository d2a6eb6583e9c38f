"""Generate end to end through the router's servicer, against scripted pods on real sockets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import pytest
from transformers import PreTrainedTokenizerBase

from common.block_hash import block_extra_keys, hash_prompt_blocks
from common.errors import InvalidArgumentError, ResourceExhaustedError, UnavailableError
from common.grpc_errors import bad_request_fields, retry_delay_s
from pdserve.v1 import generation_pb2, sampling_pb2
from router.migration import BACKOFF_MAX_S, RetryBudget
from router.model_info import ModelInfo
from router.tokenizer_pool import TokenizerPool
from tests.router.fake_pods import BLOCK_SIZE, MODEL, WAIT_S, FakeDecode, FakePrefill, decode_steps, router_over

pytestmark = pytest.mark.anyio

TEXT = " The quick brown fox jumps over the lazy dog, then naps under a tall green tree until dusk"
PROMPT = list(range(1000, 1040))  # 2 full blocks and 8 tokens


@pytest.fixture(scope="module")
def model(smollm2_path: Path) -> ModelInfo:
    return ModelInfo.from_folder(MODEL, smollm2_path, BLOCK_SIZE)


@pytest.fixture(scope="module")
def output_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids: list[int] = tokenizer.encode(TEXT)
    return ids


def _request(max_tokens: int = 16, **params: object) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(token_ids=PROMPT), request_id="req-1",
        sampling_params=sampling_pb2.SamplingParams(max_tokens=max_tokens, **params),  # type: ignore[arg-type]
    )  # fmt: skip


async def _collect(call: object) -> list[generation_pb2.GenerateResponse]:
    """Every remaining response of a Generate call (read with `read`, so it may follow earlier reads)."""
    responses = []
    while (response := await call.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
        responses.append(response)
    return responses


async def test_tokens_stream_in_order_with_usage_and_metrics(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    prefill = FakePrefill(first_token_id=output_ids[0], num_cached_tokens=16)
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:]))
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        responses = await _collect(router.stub.Generate(_request(max_tokens=len(output_ids), logprobs=True)))

    assert [list(r.token_ids) for r in responses] == [[t] for t in output_ids]
    assert "".join(r.text for r in responses) == tokenizer.decode(output_ids) == TEXT
    assert [list(r.logprobs) for r in responses] == [[-0.5]] + [[-1.0]] * (len(output_ids) - 1)
    assert {r.request_id for r in responses} == {"req-1"}
    assert [r.finish_reason for r in responses[:-1]] == [sampling_pb2.FINISH_REASON_UNSPECIFIED] * (len(responses) - 1)
    last = responses[-1]
    assert last.finish_reason == sampling_pb2.FINISH_REASON_LENGTH
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.cached_prompt_tokens) == (
        40, len(output_ids), 16)  # fmt: skip
    assert not any(r.HasField("usage") or r.HasField("metrics") for r in responses[:-1])
    metrics = last.metrics
    assert (metrics.prefill_pod_id, metrics.decode_pod_id, metrics.num_attempts) == ("prefill-0", "decode-0", 1)
    assert (metrics.kv_transfer_bytes, metrics.kv_transfer_duration.ToNanoseconds()) == (4096, 5_000_000)
    ttft = metrics.time_to_first_token.ToNanoseconds()
    assert 0 < ttft <= metrics.time_to_first_decode_token.ToNanoseconds()

    (reserve,) = decode.reserves
    assert (reserve.num_prompt_tokens, reserve.max_tokens) == (40, len(output_ids))
    (prefill_request,) = prefill.requests
    assert list(prefill_request.prompt_token_ids) == PROMPT
    assert list(prefill_request.kv_target.block_ids) == [100, 101, 102]
    assert prefill_request.request_id == reserve.request_id and reserve.request_id.startswith("req-1.")
    assert prefill_request.sampling_params.n == 1 and prefill_request.sampling_params.logprobs
    (decode_request,) = decode.decodes
    assert (decode_request.transfer_id, decode_request.first_token_id) == ("decode-0-t1", output_ids[0])
    assert list(decode_request.prompt_token_ids) == PROMPT
    assert decode.releases == []
    assert decode.time_remaining == [None]


async def test_first_token_reaches_the_client_while_decode_and_transfer_are_pending(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    client_got_first = asyncio.Event()
    prefill = FakePrefill(first_token_id=output_ids[0], transfer_gate=client_got_first)
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:4]), decode_gate=client_got_first)
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        call = router.stub.Generate(_request(max_tokens=4), timeout=30.0)
        first = await asyncio.wait_for(call.read(), WAIT_S)
        assert list(first.token_ids) == [output_ids[0]]
        assert not prefill.finished.is_set()
        client_got_first.set()
        rest = await _collect(call)
    assert decode.gate_results == [True]
    assert [t for r in rest for t in r.token_ids] == output_ids[1:4]
    assert rest[-1].metrics.kv_transfer_bytes == 4096
    (remaining,) = decode.time_remaining
    # NOTE: the client's 30 s deadline reaches the decode pod; gRPC rounds a timeout up as it encodes it on the wire
    # (grpc-timeout has at most 8 digits; C-core rounds to coarser units), so a pod may see a little over 30 s.
    assert remaining is not None and 0 < remaining <= 30.5


async def test_stop_string_spanning_tokens_cuts_the_text_and_cancels_decode(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    stop = "fox ju"
    spans = [tokenizer.decode([t]) for t in output_ids]
    assert "fox" in spans[3] and spans[4].startswith(" ju")  # the stop string spans two tokens
    prefill = FakePrefill(first_token_id=output_ids[0])
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:]), step_delay_s=0.02)
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        responses = await _collect(router.stub.Generate(_request(max_tokens=50, stop=["lazy", stop, "zzz"])))
        assert await asyncio.wait_for(decode.cancelled.wait(), WAIT_S)

    assert "".join(r.text for r in responses) == TEXT[: TEXT.index(stop)] == " The quick brown "
    last = responses[-1]
    assert (last.finish_reason, last.stop_reason.stop_str) == (sampling_pb2.FINISH_REASON_STOP, stop)
    received = [t for r in responses for t in r.token_ids]
    assert received == output_ids[: len(received)] and len(received) == 5
    assert last.usage.completion_tokens == 5


async def test_include_stop_str_and_stop_on_the_first_token(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    prefill = FakePrefill(first_token_id=output_ids[0])
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:]))
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        request = _request(max_tokens=50, stop=["brown"], include_stop_str_in_output=True)
        responses = await _collect(router.stub.Generate(request))
        assert "".join(r.text for r in responses) == " The quick brown"
        first_only = await _collect(router.stub.Generate(_request(max_tokens=50, stop=["Th"])))
    (only,) = first_only
    assert (only.text, list(only.token_ids), only.stop_reason.stop_str) == (" ", [output_ids[0]], "Th")
    assert len(decode.decodes) == 1 and decode.releases == ["decode-0-t2"]


async def test_client_cancellation_cancels_prefill_and_decode(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    never = asyncio.Event()
    prefill = FakePrefill(first_token_id=output_ids[0], transfer_gate=never)
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:] * 5), step_delay_s=0.05)
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        call = router.stub.Generate(_request(max_tokens=200))
        await call.read()
        await call.read()
        call.cancel()
        await asyncio.wait_for(decode.cancelled.wait(), WAIT_S)
        await asyncio.wait_for(prefill.cancelled.wait(), WAIT_S)
        for _ in range(250):
            if decode.releases:
                break
            await asyncio.sleep(0.02)
    # NOTE: Released although Decode claimed it (a no-op on a real pod): the router cannot tell whether its cancelled
    # Decode call reached the pod, and an unclaimed reservation would hold its blocks until the claim window lapses.
    assert decode.releases == ["decode-0-t1"]


async def test_cancellation_before_the_first_token_releases_the_reservation(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo
) -> None:
    prefill = FakePrefill(first_token_gate=asyncio.Event())
    decode = FakeDecode("decode-0", decode_steps([5]))
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        call = router.stub.Generate(_request())
        for _ in range(250):
            if prefill.requests:
                break
            await asyncio.sleep(0.02)
        call.cancel()
        await asyncio.wait_for(prefill.cancelled.wait(), WAIT_S)
        for _ in range(250):
            if decode.releases:
                break
            await asyncio.sleep(0.02)
    assert decode.releases == ["decode-0-t1"]
    assert decode.decodes == []


async def test_unavailable_prefill_pod_is_retried_on_another(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    draining = FakePrefill(fail=UnavailableError("draining"))
    healthy = FakePrefill(first_token_id=output_ids[0])
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:3]))
    prefills = {"prefill-a": draining, "prefill-b": healthy}
    async with router_over(prefills, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        router.directory.answer = {"prefill-a": 2}  # so prefill-a is tried first
        responses = await _collect(router.stub.Generate(_request(max_tokens=3)))
        assert router.pods.pods("prefill") == [p for p in router.pods.all_pods if p.pod_id == "prefill-b"]
    assert [t for r in responses for t in r.token_ids] == output_ids[:3]
    metrics = responses[-1].metrics
    assert (metrics.prefill_pod_id, metrics.num_attempts) == ("prefill-b", 2)
    assert (len(draining.requests), len(healthy.requests), len(decode.reserves)) == (1, 1, 2)
    assert decode.releases == ["decode-0-t1"]
    assert decode.decodes[0].transfer_id == "decode-0-t2"


async def test_every_prefill_pod_unavailable_is_unavailable(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo
) -> None:
    prefills = {f"prefill-{i}": FakePrefill(fail=UnavailableError("draining")) for i in range(2)}
    decode = FakeDecode("decode-0", decode_steps([5]))
    async with router_over(prefills, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _collect(router.stub.Generate(_request()))
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert retry_delay_s(info.value) == BACKOFF_MAX_S
    # NOTE: max_attempts 3: both pods, then (every pod skipped once) one of them again.
    assert sorted(decode.releases) == ["decode-0-t1", "decode-0-t2", "decode-0-t3"]


async def test_decode_pods_out_of_kv_are_skipped_then_resource_exhausted(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    full = FakeDecode("decode-a", reserve_fail=ResourceExhaustedError("no free KV blocks"))
    roomy = FakeDecode("decode-b", decode_steps(output_ids[1:2]))
    prefill = FakePrefill(first_token_id=output_ids[0])
    decodes = {"decode-a": full, "decode-b": roomy}
    async with router_over({"prefill-0": prefill}, decodes, tokenizer_pool, tokenizer, model) as router:
        for _ in range(2):  # whichever is tried first, the roomy one serves
            responses = await _collect(router.stub.Generate(_request(max_tokens=2)))
            assert responses[-1].metrics.decode_pod_id == "decode-b"
        roomy.reserve_fail = ResourceExhaustedError("no free KV blocks")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _collect(router.stub.Generate(_request(max_tokens=2)))
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert prefill.requests[2:] == []


async def test_the_first_token_ending_the_request_releases_instead_of_decoding(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo
) -> None:
    eos = model.eos_token_ids[0]
    prefill = FakePrefill(first_token_id=eos, finish_reason=sampling_pb2.FINISH_REASON_STOP, stop_token_id=eos)
    decode = FakeDecode("decode-0", decode_steps([5]))
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        (only,) = await _collect(router.stub.Generate(_request()))
    assert (only.text, list(only.token_ids), only.finish_reason) == ("", [eos], sampling_pb2.FINISH_REASON_STOP)
    assert only.stop_reason.stop_token_id == eos
    assert only.usage.completion_tokens == 1
    assert not only.metrics.HasField("time_to_first_decode_token")
    assert (decode.decodes, decode.releases) == ([], ["decode-0-t1"])


async def test_a_failed_kv_transfer_migrates_until_the_attempts_are_spent(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:5]), decode_gate=asyncio.Event())
    prefill = FakePrefill(
        first_token_id=output_ids[0],
        later_first_token_ids=output_ids[1:3],
        transfer_gate=decode.entered,
        fail_after_first=UnavailableError("receiver went away"),
    )
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        call = router.stub.Generate(_request(max_tokens=5))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await asyncio.wait_for(_collect(call), WAIT_S / 2)
        await asyncio.wait_for(decode.cancelled.wait(), WAIT_S / 2)
    # NOTE: each leg streamed its first token, then lost its transfer; the 3rd failure (max_attempts) ends it.
    assert [list(r.prompt_token_ids) for r in prefill.requests] == [PROMPT, PROMPT + output_ids[:1],
                                                                    PROMPT + output_ids[:2]]  # fmt: skip
    assert [r.sampling_params.max_tokens for r in prefill.requests] == [5, 4, 3]
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "3 attempts failed, the last: Prefill on pod prefill-0: receiver went away" in (info.value.details() or "")


async def test_a_decode_pod_dying_mid_stream_migrates_the_stream_to_another(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    num_tokens = len(output_ids)
    dying = FakeDecode("decode-a", decode_steps(output_ids[1:]), fail_after_steps=3)
    healthy = FakeDecode("decode-b", decode_steps(output_ids[5:]))
    prefill = FakePrefill(first_token_id=output_ids[0], later_first_token_ids=[output_ids[4]], num_cached_tokens=16)
    decodes = {"decode-a": dying, "decode-b": healthy}
    async with router_over({"prefill-0": prefill}, decodes, tokenizer_pool, tokenizer, model) as router:
        responses = await _collect(router.stub.Generate(_request(max_tokens=num_tokens)))
        assert [pod.pod_id for pod in router.pods.pods("decode")] == ["decode-b"]
    assert [t for r in responses for t in r.token_ids] == output_ids
    assert "".join(r.text for r in responses) == TEXT
    assert {r.request_id for r in responses} == {"req-1"}
    last = responses[-1]
    assert (last.finish_reason, last.usage.completion_tokens, last.usage.cached_prompt_tokens) == (
        sampling_pb2.FINISH_REASON_LENGTH, num_tokens, 16)  # fmt: skip
    assert (last.metrics.decode_pod_id, last.metrics.num_attempts) == ("decode-b", 2)
    # NOTE: the second leg's prompt is the prompt plus the 4 tokens streamed; max_tokens shrinks by them.
    assert [list(r.prompt_token_ids) for r in prefill.requests] == [PROMPT, PROMPT + output_ids[:4]]
    assert [r.sampling_params.max_tokens for r in prefill.requests] == [num_tokens, num_tokens - 4]
    assert [(r.num_prompt_tokens, r.max_tokens) for r in healthy.reserves] == [(44, num_tokens - 4)]
    (decode_request,) = healthy.decodes
    assert (list(decode_request.prompt_token_ids), decode_request.first_token_id) == (
        PROMPT + output_ids[:4], output_ids[4])  # fmt: skip


async def test_an_empty_router_retry_budget_ends_a_failed_stream_unavailable_with_its_refill_time(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    dying = FakeDecode("decode-a", decode_steps(output_ids[1:]), fail_after_steps=2)
    healthy = FakeDecode("decode-b", decode_steps(output_ids[4:]))
    prefill = FakePrefill(first_token_id=output_ids[0], later_first_token_ids=[output_ids[3]])
    decodes = {"decode-a": dying, "decode-b": healthy}
    budget = RetryBudget(rate_per_s=4.0, burst=0, clock=lambda: 0.0)
    async with router_over(
        {"prefill-0": prefill}, decodes, tokenizer_pool, tokenizer, model, retry_budget=budget
    ) as router:
        call = router.stub.Generate(_request(max_tokens=len(output_ids)))
        streamed = []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            while (response := await call.read()) is not grpc.aio.EOF:
                streamed.extend(response.token_ids)
    assert streamed == output_ids[:3]
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert retry_delay_s(info.value) == 0.25
    assert (len(prefill.requests), healthy.reserves) == (1, [])


async def test_a_reservation_of_another_generation_is_released_and_not_used(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    restarted = FakeDecode("decode-a", decode_steps(output_ids[1:3]), generation=2)
    listed = FakeDecode("decode-b", decode_steps(output_ids[1:3]))
    prefill = FakePrefill(first_token_id=output_ids[0])
    decodes = {"decode-a": restarted, "decode-b": listed}
    async with router_over({"prefill-0": prefill}, decodes, tokenizer_pool, tokenizer, model) as router:
        responses = await _collect(router.stub.Generate(_request(max_tokens=3)))
        assert [pod.pod_id for pod in router.pods.pods("decode")] == ["decode-b"]
    assert [t for r in responses for t in r.token_ids] == output_ids[:3]
    assert (responses[-1].metrics.decode_pod_id, responses[-1].metrics.num_attempts) == ("decode-b", 2)
    assert (restarted.releases, restarted.decodes, len(prefill.requests)) == (["decode-a-t1"], [], 1)


async def test_n_completions_are_merged_by_index_with_usage_last(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    prefill = FakePrefill(first_token_id=output_ids[0], num_cached_tokens=32)
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:4]), step_delay_s=0.01)
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        responses = await _collect(router.stub.Generate(_request(max_tokens=4, n=3, seed=7)))
    by_index = {i: [r for r in responses if r.index == i] for i in range(3)}
    for index, completion in by_index.items():
        assert [t for r in completion for t in r.token_ids] == output_ids[:4], index
        assert [r.finish_reason != 0 for r in completion] == [False] * 3 + [True]
        assert completion[-1].metrics.prefill_pod_id == "prefill-0"
    assert [r.HasField("usage") for r in responses] == [False] * 11 + [True]
    usage = responses[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_prompt_tokens) == (40, 12, 32)
    assert sorted(r.sampling_params.seed for r in prefill.requests) == [7, 8, 9]
    assert {r.sampling_params.n for r in prefill.requests} == {1}
    assert len({r.request_id for r in prefill.requests}) == 3


async def test_text_and_chat_prompts_are_tokenized_by_the_pool(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo
) -> None:
    prefill = FakePrefill(first_token_id=5)
    decode = FakeDecode("decode-0", decode_steps([6]))
    chat = generation_pb2.ChatMessages(messages=[generation_pb2.ChatMessage(role="user", content="Hi there")])
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        await _collect(router.stub.Generate(generation_pb2.GenerateRequest(text=TEXT * 2)))
        await _collect(router.stub.Generate(generation_pb2.GenerateRequest(messages=chat, cache_salt="tenant-a")))
        tokenized = await router.stub.Tokenize(generation_pb2.TokenizeRequest(messages=chat))
        info = await router.stub.GetModelInfo(generation_pb2.GetModelInfoRequest())
    assert list(prefill.requests[0].prompt_token_ids) == tokenizer.encode(TEXT * 2)
    expected_chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi there"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert list(prefill.requests[1].prompt_token_ids) == list(expected_chat)
    assert prefill.requests[1].cache_salt == "tenant-a" and not prefill.requests[0].HasField("cache_salt")
    assert (list(tokenized.token_ids), tokenized.num_tokens) == (list(expected_chat), len(expected_chat))
    assert (info.model_id, info.max_model_len, info.vocab_size, info.block_size, list(info.eos_token_ids)) == (
        MODEL, 8192, 49152, 16, [2])  # fmt: skip
    # the directory is asked with the engine's block hashes: model id and salt as extra keys
    (text_hashes, live), (chat_hashes, _) = router.directory.lookups
    assert live == {"prefill-0": 1}
    assert text_hashes == hash_prompt_blocks(tokenizer.encode(TEXT * 2), BLOCK_SIZE, block_extra_keys(MODEL))
    assert len(text_hashes) == len(tokenizer.encode(TEXT * 2)) // BLOCK_SIZE == 2
    assert chat_hashes == hash_prompt_blocks(expected_chat, BLOCK_SIZE, block_extra_keys(MODEL, "tenant-a"))
    assert chat_hashes[0] != hash_prompt_blocks(expected_chat, BLOCK_SIZE, block_extra_keys(MODEL))[0]


@pytest.mark.parametrize(
    ("request_fields", "field", "message"),
    [
        ({"text": ""}, "text", "must not be empty"),
        ({}, "text", "no prompt"),
        ({"messages": generation_pb2.ChatMessages()}, "messages", "at least one message"),
        ({"token_ids": generation_pb2.TokenIds()}, "token_ids", "must not be empty"),
        ({"token_ids": generation_pb2.TokenIds(token_ids=[1, 49152])}, "token_ids", "49152 at position 1"),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(max_tokens=8192)},
            "sampling_params.max_tokens",
            "prompt (1 tokens) + max_tokens (8192) = 8193 exceeds max_model_len 8192",
        ),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(temperature=-1)},
            "sampling_params.temperature",
            "must be finite and >= 0, got -1.0",
        ),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(temperature=float("inf"))},
            "sampling_params.temperature",
            "must be finite and >= 0, got inf",
        ),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(repetition_penalty=float("nan"))},
            "sampling_params.repetition_penalty",
            "must be finite and > 0, got nan",
        ),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(max_tokens=0)},
            "sampling_params.max_tokens",
            "must be >= 1",
        ),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(stop=[""])},
            "sampling_params.stop",
            "non-empty",
        ),
        ({"text": "hi", "sampling_params": sampling_pb2.SamplingParams(n=129)}, "sampling_params.n", "<= 128"),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(stop=["x"] * 33)},
            "sampling_params.stop",
            "at most 32 stop strings, got 33",
        ),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(stop=["x" * 513])},
            "sampling_params.stop",
            "at most 512 characters, got one of 513",
        ),
        ({"text": "hi", "request_id": "r" * 257}, "request_id", "at most 256 characters, got 257"),
        ({"text": "hi", "request_id": "a b"}, "request_id", "printable ASCII without spaces"),
        ({"text": "hi", "request_id": "é"}, "request_id", "printable ASCII without spaces"),
        ({"text": "hi", "cache_salt": ""}, "cache_salt", "must be 1 to 256 characters when set, got 0"),
        ({"text": "hi", "cache_salt": "s" * 257}, "cache_salt", "must be 1 to 256 characters when set, got 257"),
        ({"text": "x" * (1024 * 1024 + 1)}, "text", "prompt of 1048577 bytes exceeds the limit of 1048576 bytes"),
        (
            {
                "messages": generation_pb2.ChatMessages(
                    messages=[generation_pb2.ChatMessage(role="u", content="é" * 524288)]
                )
            },
            "messages",
            "prompt of 1048577 bytes exceeds the limit of 1048576 bytes",
        ),
        (
            {"messages": generation_pb2.ChatMessages(messages=[generation_pb2.ChatMessage()] * 8193)},
            "messages",
            "at most 8192 messages (max_model_len), got 8193",
        ),
        # a prompt too long for the model names the prompt, not max_tokens
        ({"text": " hello" * 9000}, "text", "prompt of 9000 tokens leaves no room in max_model_len 8192"),
        (
            {"token_ids": generation_pb2.TokenIds(token_ids=[1] * 8192)},
            "token_ids",
            "prompt of 8192 tokens leaves no room in max_model_len 8192",
        ),
    ],
)
async def test_validation_errors_name_the_public_field(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo,
    request_fields: dict[str, object], field: str, message: str,
) -> None:  # fmt: skip
    prefill = FakePrefill()
    decode = FakeDecode("decode-0", decode_steps([6]))
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _collect(router.stub.Generate(generation_pb2.GenerateRequest(**request_fields)))  # type: ignore[arg-type]
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    ((reported_field, description),) = bad_request_fields(info.value)
    assert reported_field == field and message in description
    assert prefill.requests == [] and decode.reserves == []


async def test_a_pods_own_invalid_argument_reaches_the_client_and_no_pods_is_unavailable(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo
) -> None:
    prefill = FakePrefill(fail=InvalidArgumentError("max_tokens", "exceeds this pod's max_model_len 512"))
    decode = FakeDecode("decode-0", decode_steps([6]))
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _collect(router.stub.Generate(_request()))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_fields(info.value) == [("sampling_params.max_tokens", "exceeds this pod's max_model_len 512")]
    assert decode.releases == ["decode-0-t1"]
    # a decode pod's Reserve names its own top-level field; the client sees the public path
    decode.reserve_fail = InvalidArgumentError("max_tokens", "too long for this pod")
    async with router_over(
        {"prefill-0": FakePrefill()}, {"decode-0": decode}, tokenizer_pool, tokenizer, model
    ) as router:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _collect(router.stub.Generate(_request()))
    assert bad_request_fields(info.value) == [("sampling_params.max_tokens", "too long for this pod")]
    async with router_over({}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _collect(router.stub.Generate(_request()))
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "no prefill pod" in (info.value.details() or "")


async def test_an_overloaded_prefill_pod_is_resource_exhausted_without_skipping_decode_pods(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo
) -> None:
    prefill = FakePrefill(fail=ResourceExhaustedError("prefill queue is full"))
    decodes = {f"decode-{i}": FakeDecode(f"decode-{i}", decode_steps([6])) for i in range(2)}
    async with router_over({"prefill-0": prefill}, decodes, tokenizer_pool, tokenizer, model) as router:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _collect(router.stub.Generate(_request()))
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "prefill queue is full" in (info.value.details() or "")
    assert sorted(len(d.reserves) for d in decodes.values()) == [0, 1]
    assert sorted(r for d in decodes.values() for r in d.releases) == [
        f"{pod_id}-t1" for pod_id, d in decodes.items() if d.reserves
    ]
