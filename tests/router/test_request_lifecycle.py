"""Generate end to end through the router's servicer, against scripted pods on real sockets: streaming, stop
strings, cancellation, n completions and tokenization."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest
from transformers import PreTrainedTokenizerBase

from common.block_hash import block_extra_keys, hash_prompt_blocks
from pdserve.v1 import generation_pb2, sampling_pb2
from router.model_info import ModelInfo
from router.tokenizer.tokenizer_pool import TokenizerPool
from tests.router.fake_pods import BLOCK_SIZE, MODEL, WAIT_S, FakeDecode, FakePrefill, decode_steps, router_over
from tests.router.lifecycle_support import PROMPT, TEXT, collect, generate_request

pytestmark = pytest.mark.anyio


async def test_tokens_stream_in_order_with_usage_and_metrics(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    prefill = FakePrefill(first_token_id=output_ids[0], num_cached_tokens=16)
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:]))
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        responses = await collect(router.stub.Generate(generate_request(max_tokens=len(output_ids), logprobs=True)))

    assert [list(r.token_ids) for r in responses] == [[t] for t in output_ids]
    assert "".join(r.text for r in responses) == tokenizer.decode(output_ids) == TEXT
    assert [list(r.logprobs) for r in responses] == [[-0.5]] + [[-1.0]] * (len(output_ids) - 1)
    assert {r.request_id for r in responses} == {"req-1"}
    assert [r.finish_reason for r in responses[:-1]] == [sampling_pb2.FINISH_REASON_UNSPECIFIED] * (len(responses) - 1)
    last = responses[-1]
    assert last.finish_reason == sampling_pb2.FINISH_REASON_LENGTH
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.cached_prompt_tokens) == (
        40,
        len(output_ids),
        16,
    )
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


async def test_first_token_reaches_the_client_while_decode_and_transfer_are_pending(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    client_got_first = asyncio.Event()
    prefill = FakePrefill(first_token_id=output_ids[0], transfer_gate=client_got_first)
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:4]), decode_gate=client_got_first)
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        call = router.stub.Generate(generate_request(max_tokens=4), timeout=30.0)
        first = await asyncio.wait_for(call.read(), WAIT_S)
        assert list(first.token_ids) == [output_ids[0]]
        assert not prefill.finished.is_set()
        client_got_first.set()
        rest = await collect(call)
    assert decode.gate_results == [True]
    assert [t for r in rest for t in r.token_ids] == output_ids[1:4]
    assert rest[-1].metrics.kv_transfer_bytes == 4096


async def test_stop_string_spanning_tokens_cuts_the_text_and_cancels_decode(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    stop = "fox ju"
    spans = [tokenizer.decode([t]) for t in output_ids]
    assert "fox" in spans[3] and spans[4].startswith(" ju")  # the stop string spans two tokens
    prefill = FakePrefill(first_token_id=output_ids[0])
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:]), step_delay_s=0.02)
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        responses = await collect(router.stub.Generate(generate_request(max_tokens=50, stop=["lazy", stop, "zzz"])))
        assert await asyncio.wait_for(decode.cancelled.wait(), WAIT_S)

    assert "".join(r.text for r in responses) == TEXT[: TEXT.index(stop)] == " The quick brown "
    last = responses[-1]
    assert (last.finish_reason, last.stop_reason.stop_str) == (sampling_pb2.FINISH_REASON_STOP, stop)
    received = [t for r in responses for t in r.token_ids]
    assert received == output_ids[: len(received)] and len(received) == 5
    assert last.usage.completion_tokens == 5


async def test_stop_string_inside_a_multi_token_message_drops_the_tokens_after_it(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    """A speculating decode pod sends several tokens per message: those after the stop string's are not output."""
    stop = "fox ju"  # completed by output token 4
    prefill = FakePrefill(first_token_id=output_ids[0])
    steps = [
        (output_ids[1:3], 0, None),
        (output_ids[3:8], 0, None),
        (output_ids[8:], sampling_pb2.FINISH_REASON_LENGTH, None),
    ]
    decode = FakeDecode("decode-0", steps)
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        responses = await collect(router.stub.Generate(generate_request(max_tokens=50, stop=[stop])))
    assert "".join(r.text for r in responses) == TEXT[: TEXT.index(stop)]
    assert [t for r in responses for t in r.token_ids] == output_ids[:5]
    assert responses[-1].usage.completion_tokens == 5


async def test_include_stop_str_and_stop_on_the_first_token(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    prefill = FakePrefill(first_token_id=output_ids[0])
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:]))
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        request = generate_request(max_tokens=50, stop=["brown"], include_stop_str_in_output=True)
        responses = await collect(router.stub.Generate(request))
        assert "".join(r.text for r in responses) == " The quick brown"
        first_only = await collect(router.stub.Generate(generate_request(max_tokens=50, stop=["Th"])))
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
        call = router.stub.Generate(generate_request(max_tokens=200))
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


async def test_abort_ends_the_stream_with_cancelled_and_cancels_prefill_and_decode(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    never = asyncio.Event()
    prefill = FakePrefill(first_token_id=output_ids[0], transfer_gate=never)
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:] * 5), step_delay_s=0.05)
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        call = router.stub.Generate(generate_request(max_tokens=200))
        await call.read()
        await call.read()
        answer = await router.stub.Abort(generation_pb2.AbortRequest(request_id="req-1"))
        assert (answer.result, answer.num_aborted) == (generation_pb2.ABORT_RESULT_ABORTED, 1)
        # NOTE: bounded: an aborted call that gets no status would otherwise wait here for ever.
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await asyncio.wait_for(collect(call), WAIT_S)
        await asyncio.wait_for(decode.cancelled.wait(), WAIT_S)
        await asyncio.wait_for(prefill.cancelled.wait(), WAIT_S)
        for _ in range(250):
            if decode.releases:
                break
            await asyncio.sleep(0.02)
        again = await router.stub.Abort(generation_pb2.AbortRequest(request_id="req-1"))
    assert (ended.value.code(), ended.value.details()) == (grpc.StatusCode.CANCELLED, "request 'req-1' was aborted")
    assert decode.releases == ["decode-0-t1"]
    assert again.result == generation_pb2.ABORT_RESULT_ALREADY_FINISHED


async def test_cancellation_before_the_first_token_releases_the_reservation(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo
) -> None:
    prefill = FakePrefill(first_token_gate=asyncio.Event())
    decode = FakeDecode("decode-0", decode_steps([5]))
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        call = router.stub.Generate(generate_request())
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


async def test_the_first_token_ending_the_request_releases_instead_of_decoding(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo
) -> None:
    eos = model.eos_token_ids[0]
    prefill = FakePrefill(first_token_id=eos, finish_reason=sampling_pb2.FINISH_REASON_STOP, stop_token_id=eos)
    decode = FakeDecode("decode-0", decode_steps([5]))
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        (only,) = await collect(router.stub.Generate(generate_request()))
    assert (only.text, list(only.token_ids), only.finish_reason) == ("", [eos], sampling_pb2.FINISH_REASON_STOP)
    assert only.stop_reason.stop_token_id == eos
    assert only.usage.completion_tokens == 1
    assert not only.metrics.HasField("time_to_first_decode_token")
    assert (decode.decodes, decode.releases) == ([], ["decode-0-t1"])


async def test_n_completions_are_merged_by_index_with_usage_last(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    prefill = FakePrefill(first_token_id=output_ids[0], num_cached_tokens=32)
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:4]), step_delay_s=0.01)
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        responses = await collect(router.stub.Generate(generate_request(max_tokens=4, n=3, seed=7)))
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
    # NOTE: two prefill pods (one fake behind both), so that the router has a choice and asks the directory.
    prefills = {"prefill-0": prefill, "prefill-1": prefill}
    async with router_over(prefills, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        await collect(router.stub.Generate(generation_pb2.GenerateRequest(text=TEXT * 2)))
        await collect(router.stub.Generate(generation_pb2.GenerateRequest(messages=chat, cache_salt="tenant-a")))
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
        MODEL,
        8192,
        49152,
        16,
        [2],
    )
    # the directory is asked with the engine's block hashes: model id and salt as extra keys
    (text_hashes, live), (chat_hashes, _) = router.directory.lookups
    assert live == {"prefill-0": 1, "prefill-1": 1}
    assert text_hashes == hash_prompt_blocks(tokenizer.encode(TEXT * 2), BLOCK_SIZE, block_extra_keys(MODEL))
    assert len(text_hashes) == len(tokenizer.encode(TEXT * 2)) // BLOCK_SIZE == 2
    assert chat_hashes == hash_prompt_blocks(expected_chat, BLOCK_SIZE, block_extra_keys(MODEL, "tenant-a"))
    assert chat_hashes[0] != hash_prompt_blocks(expected_chat, BLOCK_SIZE, block_extra_keys(MODEL))[0]


async def test_with_one_live_prefill_pod_the_directory_is_not_asked(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo
) -> None:
    prefill = FakePrefill(first_token_id=5)
    decode = FakeDecode("decode-0", decode_steps([6]))
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        await collect(router.stub.Generate(generation_pb2.GenerateRequest(text=TEXT * 2)))
    assert router.directory.lookups == [] and len(prefill.requests) == 1
