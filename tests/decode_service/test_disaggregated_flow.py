"""Reserve -> Prefill -> Decode between a real prefill pod and a real decode pod (tcp KV transfer), as the router
drives them: tokens equal the offline engine's, and every way a request can end frees its blocks on both pods."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import grpc
import grpc.aio
import pytest

from cli.redis_server import RedisServer
from common.pod_registry import PodInfo
from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from pdserve.v1 import prefill_pb2, sampling_pb2
from tests.decode_service.pod_pair import BLOCK_SIZE, DECODE_ID, PREFILL_ID, read_all, running_pods

pytestmark = pytest.mark.anyio

MAX_TOKENS = 12
GREEDY = sampling_pb2.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
# Lengths around block boundaries; with --long-prefill-token-threshold 16, 40 and 100 prefill in 3 and 7 chunks.
PROMPT_LENGTHS = (1, 16, 40, 100)


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(512) for _ in range(length)]


def _offline_greedy(model: Path, prompts: list[list[int]]) -> list[list[int]]:
    engine = LLMEngine(engine_config(str(model), num_blocks=64))
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.req_id].extend(output.new_token_ids)
    return [outputs[str(i)] for i in range(len(prompts))]


async def test_decoded_tokens_equal_the_offline_engines(tiny_model: Path, redis_server: RedisServer) -> None:
    prompts = [_prompt(n, seed) for seed, n in enumerate(PROMPT_LENGTHS)]
    expected = _offline_greedy(tiny_model, prompts)
    async with running_pods(tiny_model, redis_server.url) as pods:
        flows = await asyncio.gather(*(pods.generate(prompt, GREEDY) for prompt in prompts))
        assert [flow.token_ids for flow in flows] == expected
        for prompt, flow in zip(prompts, flows, strict=True):
            # FirstToken first (before the transfer's end), then TransferDone, the last message.
            assert [r.WhichOneof("event") for r in flow.prefill] == ["first_token", "transfer_done"]
            num_blocks = -(-len(prompt) // BLOCK_SIZE)
            assert len(flow.reserve.kv_target.block_ids) == num_blocks
            done = flow.prefill[1].transfer_done
            block_nbytes = flow.reserve.kv_target.layout.block_nbytes
            assert (done.num_blocks, done.num_bytes) == (num_blocks, num_blocks * block_nbytes)
            # NOTE: a message carries one engine step's tokens, or several steps' when the reader lagged.
            assert sum(len(r.token_ids) for r in flow.decode) == MAX_TOKENS - 1
            assert all(r.token_ids for r in flow.decode)
            unfinished = [sampling_pb2.FINISH_REASON_UNSPECIFIED] * (len(flow.decode) - 1)
            assert [r.finish_reason for r in flow.decode] == [*unfinished, sampling_pb2.FINISH_REASON_LENGTH]
        await pods.wait_until_idle()


async def test_cancelling_decode_frees_both_pods_blocks(tiny_model: Path, redis_server: RedisServer) -> None:
    prompt = _prompt(70, seed=7)
    params = sampling_pb2.SamplingParams(temperature=0.0, max_tokens=800, ignore_eos=True)
    async with running_pods(tiny_model, redis_server.url) as pods:
        reserve = await pods.reserve(prompt, 800)
        first = await pods.start_prefill(prompt, params, reserve).read()
        assert isinstance(first, prefill_pb2.PrefillResponse)
        decode_call = pods.start_decode(prompt, params, reserve, first.first_token.token_id)
        for _ in range(3):
            await decode_call.read()
        await pods.wait_for_pod(DECODE_ID, lambda info: info is not None and info.num_running == 1, 2.0)
        decode_call.cancel()
        start = time.monotonic()
        await pods.wait_until_idle()
        assert time.monotonic() - start < 2.0


async def test_cancelling_prefill_mid_transfer_frees_both_pods_blocks(
    tiny_model: Path, redis_server: RedisServer
) -> None:
    # NOTE: 62 chunks of 16 tokens: the call is cancelled while the first few are computed, long before the last.
    prompt = _prompt(990, seed=3)
    async with running_pods(tiny_model, redis_server.url) as pods:
        reserve = await pods.reserve(prompt, MAX_TOKENS)
        prefill_call = pods.start_prefill(prompt, GREEDY, reserve)
        await pods.wait_for_pod(PREFILL_ID, lambda info: info is not None and info.num_running == 1, 2.0)
        prefill_call.cancel()
        # NOTE: no Release: the aborted transfer alone frees the decode pod's reservation (its lease is 10 s).
        start = time.monotonic()
        await pods.wait_until_idle()
        assert time.monotonic() - start < 2.0
        # The pods still serve after the cancelled call.
        assert len((await pods.generate(prompt[:40], GREEDY)).token_ids) == MAX_TOKENS


async def test_first_token_that_ends_the_request_skips_the_transfer(
    tiny_model: Path, redis_server: RedisServer
) -> None:
    prompt = _prompt(40, seed=4)
    params = sampling_pb2.SamplingParams(temperature=0.0, max_tokens=1)
    async with running_pods(tiny_model, redis_server.url) as pods:
        reserve = await pods.reserve(prompt, 1)
        responses = await read_all(pods.start_prefill(prompt, params, reserve))
        assert [r.WhichOneof("event") for r in responses] == ["first_token"]
        assert responses[0].first_token.finish_reason == sampling_pb2.FINISH_REASON_LENGTH
        await pods.release(reserve)
        await pods.wait_until_idle()


def _blocks(info: PodInfo) -> tuple[int, int]:
    """(free, reserved) blocks of a pod's registry entry."""
    return info.num_free_blocks, info.num_reserved_blocks


async def test_unclaimed_reservation_lapses_within_its_lease(tiny_model: Path, redis_server: RedisServer) -> None:
    lease_s = 1.0
    async with running_pods(tiny_model, redis_server.url, decode_flags=["--kv-lease-s", str(lease_s)]) as pods:
        reserve = await pods.reserve(_prompt(40, seed=5), MAX_TOKENS)
        reserved_at = time.monotonic()
        assert reserve.lease.ToTimedelta().total_seconds() == lease_s
        # The registry entry tells the reserved blocks apart from those of admitted requests (the autoscaler's).
        await pods.wait_for_pod(DECODE_ID, lambda info: info is not None and _blocks(info) == (64 - 3, 3), 1.0)
        await pods.wait_for_pod(DECODE_ID, lambda info: info is not None and _blocks(info) == (64, 0), lease_s + 1)
        assert time.monotonic() - reserved_at <= lease_s + 1


async def test_reserve_on_a_full_pool_is_resource_exhausted(tiny_model: Path, redis_server: RedisServer) -> None:
    async with running_pods(tiny_model, redis_server.url, decode_flags=["--num-blocks", "8"]) as pods:
        first = await pods.reserve(_prompt(100, seed=6), MAX_TOKENS)
        assert len(first.kv_target.block_ids) == 7
        # NOTE: the registry shows the reservation first, so that the idle wait below never reads a heartbeat from
        # before it (a slow heartbeat would pass that wait before the release took effect).
        await pods.wait_for_pod(DECODE_ID, lambda info: info is not None and info.num_free_blocks == 1, 2.0)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await pods.reserve(_prompt(40, seed=6), MAX_TOKENS)
        assert error.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        await pods.release(first)
        await pods.wait_until_idle()
        second = await pods.reserve(_prompt(40, seed=6), MAX_TOKENS)
        assert len(second.kv_target.block_ids) == 3
        await pods.release(second)


async def test_seeded_sampling_equals_the_offline_engines(tiny_model: Path, redis_server: RedisServer) -> None:
    # NOTE: each draw depends on (seed, position) only, so the decode pod carries on from the prefill pod's token.
    prompt = _prompt(40, seed=9)
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=MAX_TOKENS, ignore_eos=True)
    engine = LLMEngine(engine_config(str(tiny_model), num_blocks=64))
    engine.add_request("seeded", prompt, seeded)
    expected: list[int] = []
    while engine.has_unfinished_requests():
        expected.extend(t for output in engine.step() for t in output.new_token_ids)
    params = sampling_pb2.SamplingParams(temperature=1.0, seed=1234, max_tokens=MAX_TOKENS, ignore_eos=True)
    async with running_pods(tiny_model, redis_server.url) as pods:
        assert (await pods.generate(prompt, params)).token_ids == expected
        # Two requests with the same seed in one batch draw the same tokens.
        flows = await asyncio.gather(pods.generate(prompt, params), pods.generate(prompt, params))
        assert [flow.token_ids for flow in flows] == [expected, expected]
