"""PrefillService over real sockets: input checks, the layout handshake, logprobs, and KV events reaching the Redis
prefix directory."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import grpc.aio
import pytest

from cli.redis_server import RedisServer
from common.block_hash import block_extra_keys, hash_prompt_blocks
from common.grpc.errors import bad_request_fields
from common.prefix_directory import PrefixDirectory
from pdserve.v1 import kv_transfer_pb2, prefill_pb2, sampling_pb2
from tests.decode_service.pod_pair import BLOCK_SIZE, PREFILL_ID, PodPair, read_all, running_pods

pytestmark = pytest.mark.anyio

GREEDY = sampling_pb2.SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
PROMPT = [(7 * i + 3) % 512 for i in range(40)]


async def _prefill_error(pods: PodPair, request: prefill_pb2.PrefillRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await read_all(pods.prefill.Prefill(request))
    return error.value


async def test_bad_input_is_invalid_argument_naming_the_field(tiny_model: Path, redis_server: RedisServer) -> None:
    async with running_pods(tiny_model, redis_server.url) as pods:
        reserve = await pods.reserve(PROMPT, 4)

        def request(prompt: list[int], max_tokens: int = 4, n: int = 1) -> prefill_pb2.PrefillRequest:
            sampling = sampling_pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens, n=n)
            return prefill_pb2.PrefillRequest(
                request_id="bad", prompt_token_ids=prompt, sampling_params=sampling, kv_target=reserve.kv_target
            )

        cases = {
            "prompt_token_ids": request([]),
            "sampling_params.max_tokens": request(PROMPT, max_tokens=2000),
            "sampling_params.n": request(PROMPT, n=2),
            "kv_target.block_ids": request(PROMPT[:10]),
        }
        for field, bad in cases.items():
            error = await _prefill_error(pods, bad)
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, field
            assert [f for f, _ in bad_request_fields(error)] == [field]
        wrong_backend = request(PROMPT)
        wrong_backend.kv_target.backend = kv_transfer_pb2.TRANSFER_BACKEND_NCCL
        assert bad_request_fields(await _prefill_error(pods, wrong_backend))[0][0] == "kv_target.backend"
        # Nothing was admitted: the reservation is still whole and usable.
        assert len((await pods.generate(PROMPT, GREEDY, reserve)).token_ids) == 4
        await pods.wait_until_idle()


async def test_foreign_kv_layout_or_parallel_sizes_are_failed_precondition(
    tiny_model: Path, redis_server: RedisServer
) -> None:
    async with running_pods(tiny_model, redis_server.url) as pods:
        reserve = await pods.reserve(PROMPT, 4)
        request = prefill_pb2.PrefillRequest(
            request_id="r", prompt_token_ids=PROMPT, sampling_params=GREEDY, kv_target=reserve.kv_target
        )
        tp2 = prefill_pb2.PrefillRequest()
        tp2.CopyFrom(request)
        request.kv_target.layout.head_dim = 64
        request.kv_target.layout.block_nbytes *= 2
        error = await _prefill_error(pods, request)
        assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "head_dim: 32 vs 64" in (error.details() or "")
        # A decode pod of another tensor-parallel size: refused before anything moves, naming both sizes.
        tp2.kv_target.layout.tp_size = 2
        error = await _prefill_error(pods, tp2)
        assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "tensor_parallel_size 1 on the prefill pod differs from 2 on the decode pod" in (error.details() or "")
        await pods.release(reserve)
        await pods.wait_until_idle()


async def test_transfer_into_a_released_reservation_fails_and_frees_the_blocks(
    tiny_model: Path, redis_server: RedisServer
) -> None:
    async with running_pods(tiny_model, redis_server.url) as pods:
        reserve = await pods.reserve(PROMPT, 4)
        await pods.release(reserve)
        error = await _prefill_error(
            pods,
            prefill_pb2.PrefillRequest(
                request_id="r", prompt_token_ids=PROMPT, sampling_params=GREEDY, kv_target=reserve.kv_target
            ),
        )
        assert error.code() is grpc.StatusCode.ABORTED
        assert "aborted" in (error.details() or "")
        await pods.wait_until_idle()


async def test_logprobs_when_asked(tiny_model: Path, redis_server: RedisServer) -> None:
    params = sampling_pb2.SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=True)
    async with running_pods(tiny_model, redis_server.url) as pods:
        flow = await pods.generate(PROMPT, params)
        first = flow.prefill[0].first_token
        assert first.HasField("logprob") and first.logprob < 0
        # NOTE: a message may carry several steps (the reader was slower than the engine): one logprob per token.
        assert [len(r.logprobs) for r in flow.decode] == [len(r.token_ids) for r in flow.decode]
        assert sum(len(r.token_ids) for r in flow.decode) == 3
        plain = await pods.generate(PROMPT, GREEDY)
        assert not plain.prefill[0].first_token.HasField("logprob")
        assert plain.token_ids == flow.token_ids
        # The second run of the same prompt reuses the prefill pod's cached full blocks.
        assert plain.prefill[0].first_token.num_cached_tokens == 32


async def test_kv_events_reach_the_prefix_directory(tiny_model: Path, redis_server: RedisServer) -> None:
    async with running_pods(tiny_model, redis_server.url) as pods:
        await pods.generate(PROMPT, GREEDY)
        hashes = hash_prompt_blocks(PROMPT, BLOCK_SIZE, block_extra_keys(str(tiny_model)))
        live = {PREFILL_ID: pods.pods[PREFILL_ID].generation}
        directory = PrefixDirectory(redis_server.url)
        try:
            deadline = time.monotonic() + 2.0
            while (found := await directory.longest_prefix(hashes, live)) != {PREFILL_ID: 2}:
                assert time.monotonic() < deadline, f"directory says {found}"
                await asyncio.sleep(0.02)
        finally:
            await directory.aclose()
