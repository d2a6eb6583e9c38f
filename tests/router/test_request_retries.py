"""Generate end to end through the router's servicer, against scripted pods on real sockets: pods that fail, refuse
or die, and the retries and migrations that follow (or the status the client gets when they are spent)."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest
from transformers import PreTrainedTokenizerBase

from common.errors import ResourceExhaustedError, UnavailableError
from common.grpc.errors import retry_delay_s
from pdserve.v1 import sampling_pb2
from router.completion.migration import BACKOFF_MAX_S, RetryBudget
from router.model_info import ModelInfo
from router.tokenizer.tokenizer_pool import TokenizerPool
from tests.router.fake_pods import WAIT_S, FakeDecode, FakePrefill, decode_steps, router_over
from tests.router.lifecycle_support import PROMPT, TEXT, collect, generate_request

pytestmark = pytest.mark.anyio


async def test_unavailable_prefill_pod_is_retried_on_another(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    draining = FakePrefill(fail=UnavailableError("draining"))
    healthy = FakePrefill(first_token_id=output_ids[0])
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:3]))
    prefills = {"prefill-a": draining, "prefill-b": healthy}
    async with router_over(prefills, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        router.directory.answer = {"prefill-a": 2}  # so prefill-a is tried first
        responses = await collect(router.stub.Generate(generate_request(max_tokens=3)))
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
            await collect(router.stub.Generate(generate_request()))
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert retry_delay_s(info.value) == BACKOFF_MAX_S
    # NOTE: max_attempts 3: both pods, then (every pod skipped once) one of them again.
    assert sorted(decode.releases) == ["decode-0-t1", "decode-0-t2", "decode-0-t3"]


async def test_a_decode_pod_out_of_kv_is_skipped_for_one_with_room(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    full = FakeDecode("decode-a", reserve_fail=ResourceExhaustedError("no free KV blocks"))
    roomy = FakeDecode("decode-b", decode_steps(output_ids[1:2]))
    prefill = FakePrefill(first_token_id=output_ids[0])
    decodes = {"decode-a": full, "decode-b": roomy}
    async with router_over({"prefill-0": prefill}, decodes, tokenizer_pool, tokenizer, model) as router:
        for _ in range(2):  # whichever is tried first, the roomy one serves
            responses = await collect(router.stub.Generate(generate_request(max_tokens=2)))
            assert responses[-1].metrics.decode_pod_id == "decode-b"
    assert (len(prefill.requests), len(roomy.reserves)) == (2, 2)


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
        call = router.stub.Generate(generate_request(max_tokens=5))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await asyncio.wait_for(collect(call), WAIT_S / 2)
        await asyncio.wait_for(decode.cancelled.wait(), WAIT_S / 2)
    # NOTE: each leg streamed its first token, then lost its transfer; the 3rd failure (max_attempts) ends it.
    assert [list(r.prompt_token_ids) for r in prefill.requests] == [
        PROMPT,
        PROMPT + output_ids[:1],
        PROMPT + output_ids[:2],
    ]
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
        responses = await collect(router.stub.Generate(generate_request(max_tokens=num_tokens)))
        assert [pod.pod_id for pod in router.pods.pods("decode")] == ["decode-b"]
    assert [t for r in responses for t in r.token_ids] == output_ids
    assert "".join(r.text for r in responses) == TEXT
    assert {r.request_id for r in responses} == {"req-1"}
    last = responses[-1]
    assert (last.finish_reason, last.usage.completion_tokens, last.usage.cached_prompt_tokens) == (
        sampling_pb2.FINISH_REASON_LENGTH,
        num_tokens,
        16,
    )
    assert (last.metrics.decode_pod_id, last.metrics.num_attempts) == ("decode-b", 2)
    # NOTE: the second leg's prompt is the prompt plus the 4 tokens streamed; max_tokens shrinks by them.
    assert [list(r.prompt_token_ids) for r in prefill.requests] == [PROMPT, PROMPT + output_ids[:4]]
    assert [r.sampling_params.max_tokens for r in prefill.requests] == [num_tokens, num_tokens - 4]
    assert [(r.num_prompt_tokens, r.max_tokens) for r in healthy.reserves] == [(44, num_tokens - 4)]
    (decode_request,) = healthy.decodes
    assert (list(decode_request.prompt_token_ids), decode_request.first_token_id) == (
        PROMPT + output_ids[:4],
        output_ids[4],
    )


KV_POOL_FULL = ResourceExhaustedError("request must leave the full KV pool, its images are not here: prefill it again")


async def test_a_decode_pod_ending_a_request_for_want_of_kv_migrates_it_and_stays_in_use(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    """A decode pod that ends a request with RESOURCE_EXHAUSTED (an image prompt it could neither keep nor
    recompute): the request is prefilled again with what it streamed and decodes on another pod; the full pod is
    not suspect."""
    num_tokens = len(output_ids)
    full = FakeDecode("decode-a", decode_steps(output_ids[1:]), end_after_steps=3, end_error=KV_POOL_FULL)
    roomy = FakeDecode("decode-b", decode_steps(output_ids[5:]))
    prefill = FakePrefill(first_token_id=output_ids[0], later_first_token_ids=[output_ids[4]])
    decodes = {"decode-a": full, "decode-b": roomy}
    async with router_over({"prefill-0": prefill}, decodes, tokenizer_pool, tokenizer, model) as router:
        responses = await collect(router.stub.Generate(generate_request(max_tokens=num_tokens)))
        assert [pod.pod_id for pod in router.pods.pods("decode")] == ["decode-a", "decode-b"]
    assert [t for r in responses for t in r.token_ids] == output_ids
    assert "".join(r.text for r in responses) == TEXT
    last = responses[-1]
    assert (last.finish_reason, last.metrics.decode_pod_id, last.metrics.num_attempts) == (
        sampling_pb2.FINISH_REASON_LENGTH,
        "decode-b",
        2,
    )
    assert [list(r.prompt_token_ids) for r in prefill.requests] == [PROMPT, PROMPT + output_ids[:4]]
    assert [r.sampling_params.max_tokens for r in prefill.requests] == [num_tokens, num_tokens - 4]
    assert [(r.num_prompt_tokens, r.max_tokens) for r in roomy.reserves] == [(44, num_tokens - 4)]


async def test_requests_ended_for_want_of_kv_spend_the_attempts(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    """Each such end costs a prefill: it counts as a failed attempt, so pods that keep ending the request cannot
    loop it forever (max_attempts 3)."""
    decodes = {
        f"decode-{name}": FakeDecode(
            f"decode-{name}", decode_steps(output_ids[k : k + 2]), end_after_steps=1, end_error=KV_POOL_FULL
        )
        for name, k in (("a", 1), ("b", 3), ("c", 5))
    }
    prefill = FakePrefill(first_token_id=output_ids[0], later_first_token_ids=[output_ids[2], output_ids[4]])
    async with router_over({"prefill-0": prefill}, decodes, tokenizer_pool, tokenizer, model) as router:
        call = router.stub.Generate(generate_request(max_tokens=len(output_ids)))
        streamed = []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            while (response := await call.read()) is not grpc.aio.EOF:
                streamed.extend(response.token_ids)
        assert len(router.pods.pods("decode")) == 3
    assert streamed == output_ids[:6]
    assert [list(r.prompt_token_ids) for r in prefill.requests] == [
        PROMPT,
        PROMPT + output_ids[:2],
        PROMPT + output_ids[:4],
    ]
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "3 attempts failed, the last: Decode on pod decode-c: request must leave" in (info.value.details() or "")


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
        call = router.stub.Generate(generate_request(max_tokens=len(output_ids)))
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
        responses = await collect(router.stub.Generate(generate_request(max_tokens=3)))
        assert [pod.pod_id for pod in router.pods.pods("decode")] == ["decode-b"]
    assert [t for r in responses for t in r.token_ids] == output_ids[:3]
    assert (responses[-1].metrics.decode_pod_id, responses[-1].metrics.num_attempts) == ("decode-b", 2)
    assert (restarted.releases, restarted.decodes, len(prefill.requests)) == (["decode-a-t1"], [], 1)


async def test_an_overloaded_prefill_pod_is_resource_exhausted_without_skipping_decode_pods(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo
) -> None:
    prefill = FakePrefill(fail=ResourceExhaustedError("prefill queue is full"))
    decodes = {f"decode-{i}": FakeDecode(f"decode-{i}", decode_steps([6])) for i in range(2)}
    async with router_over({"prefill-0": prefill}, decodes, tokenizer_pool, tokenizer, model) as router:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(router.stub.Generate(generate_request()))
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "prefill queue is full" in (info.value.details() or "")
    assert sorted(len(d.reserves) for d in decodes.values()) == [0, 1]
    assert sorted(r for d in decodes.values() for r in d.releases) == [
        f"{pod_id}-t1" for pod_id, d in decodes.items() if d.reserves
    ]
