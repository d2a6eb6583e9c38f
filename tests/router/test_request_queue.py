"""Generate through the router's servicer against scripted pods on real sockets, when capacity is momentarily short:
no live pod yet, every decode pod out of KV blocks, no room in flight to the prefill pods. The call waits in the
router's queue and is served once capacity returns; past the queue's bound it ends with a status and a RetryInfo."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import grpc.aio
import pytest
from transformers import PreTrainedTokenizerBase

from common.errors import ResourceExhaustedError
from common.grpc.errors import retry_delay_s
from router.config import RouterConfig
from router.model_info import ModelInfo
from router.tokenizer.tokenizer_pool import TokenizerPool
from tests.router.fake_pods import WAIT_S, FakeDecode, FakePrefill, decode_steps, router_over
from tests.router.lifecycle_support import collect, generate_request

pytestmark = pytest.mark.anyio

SHORT_WAIT = RouterConfig(max_queue_wait_s=0.3, max_retry_s=2.0)
"""A queue whose bound the tests wait out."""


async def _until(condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    """Poll `condition()` (every 10 ms) until it holds; fail after `timeout_s`."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def _tokens(call: object) -> list[int]:
    """The token ids of a Generate call, read to its end."""
    return [t for r in await collect(call) for t in r.token_ids]


async def test_a_call_waits_for_a_live_pod_and_is_served_once_one_is_listed(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    prefill = FakePrefill(first_token_id=output_ids[0])
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:3]))
    pods = ({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model)
    async with router_over(*pods, listed=False) as router:
        call = asyncio.ensure_future(_tokens(router.stub.Generate(generate_request(max_tokens=3))))
        await _until(lambda: router.admission.num_waiting == 1)
        router.registry.pods = [info for info in router.infos if info.role == "prefill"]
        await router.pods.refresh()
        await asyncio.sleep(0.05)
        assert (call.done(), router.admission.num_waiting, prefill.requests) == (False, 1, [])  # no decode pod yet
        router.registry.pods = router.infos
        await router.pods.refresh()
        assert await call == output_ids[:3]
    async with router_over(*pods, config=SHORT_WAIT, listed=False) as router:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(router.stub.Generate(generate_request()))
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert (info.value.details() or "").startswith("no prefill pod is available (waited 0.")
    assert retry_delay_s(info.value) == SHORT_WAIT.max_retry_s
    assert len(prefill.requests) == 1


async def test_a_completion_waits_while_every_decode_pod_is_full_and_goes_on_once_one_has_room(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    full = ResourceExhaustedError("no free KV blocks")
    decodes = {name: FakeDecode(name, decode_steps(output_ids[1:2]), reserve_fail=full) for name in ("d-a", "d-b")}
    prefill = FakePrefill(first_token_id=output_ids[0])
    async with router_over({"prefill-0": prefill}, decodes, tokenizer_pool, tokenizer, model) as router:
        call = asyncio.ensure_future(router.stub.Generate(generate_request(max_tokens=2)).read())
        await _until(lambda: router.admission.num_waiting == 1)
        assert [len(d.reserves) for d in decodes.values()] == [1, 1]
        await router.pods.refresh()  # capacity may have returned: every pod is tried again, still full
        await _until(lambda: [len(d.reserves) for d in decodes.values()] == [2, 2])
        await _until(lambda: router.admission.num_waiting == 1)
        decodes["d-b"].reserve_fail = None
        await router.pods.refresh()
        first = await call
        assert (first.token_ids, len(prefill.requests)) == ([output_ids[0]], 1)
    async with router_over(
        {"prefill-0": prefill}, decodes, tokenizer_pool, tokenizer, model, config=SHORT_WAIT
    ) as router:
        decodes["d-b"].reserve_fail = full
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(router.stub.Generate(generate_request(max_tokens=2)))
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "every decode pod is out of KV blocks",
    )
    assert retry_delay_s(info.value) is not None
    assert len(prefill.requests) == 1  # no prefill without a reservation


async def test_calls_beyond_the_room_in_flight_wait_in_order_instead_of_being_refused(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, output_ids: list[int]
) -> None:
    gate = asyncio.Event()
    prefill = FakePrefill(first_token_id=output_ids[0], first_token_gate=gate)
    decode = FakeDecode("decode-0", decode_steps(output_ids[1:2]))
    config = RouterConfig(max_waiting_requests_per_prefill_pod=1)
    async with router_over(
        {"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model, config=config
    ) as router:
        calls = []
        for name in ("first", "second", "third"):
            request = generate_request(max_tokens=2)
            request.request_id = name
            calls.append(asyncio.ensure_future(_tokens(router.stub.Generate(request))))
            await _until(lambda: router.admission.state.num_queued + router.admission.state.num_in_flight == len(calls))
        # NOTE: admission counts "first" in flight before its Prefill reaches the pod.
        await _until(lambda: router.admission.num_waiting == 2 and len(prefill.requests) >= 1)
        assert [r.request_id.split(".")[0] for r in prefill.requests] == ["first"]
        gate.set()
        assert await asyncio.gather(*calls) == [output_ids[:2]] * 3
    assert [r.request_id.split(".")[0] for r in prefill.requests] == ["first", "second", "third"]
