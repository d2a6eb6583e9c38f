"""DecodeService over real sockets: input checks, health while loading, the registry entry, and draining."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import grpc.aio
import pytest
from google.rpc import code_pb2
from grpc_health.v1 import health_pb2

import decode_service.__main__ as decode_main
from cli.redis_server import RedisServer
from common.grpc.errors import bad_request_fields
from engine.core.client import EngineCoreClient
from engine.core.messages import CoreReady
from pdserve.v1 import decode_pb2, decode_pb2_grpc, kv_transfer_pb2, prefill_pb2, sampling_pb2
from tests.decode_service.pod_pair import (
    DECODE_ID,
    PREFILL_ID,
    DecodeFailed,
    DecodeStep,
    pod_flags,
    read_all,
    running_pods,
)

pytestmark = pytest.mark.anyio

PROMPT = [(5 * i + 1) % 512 for i in range(40)]
GREEDY = sampling_pb2.SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING = health_pb2.HealthCheckResponse.SERVING


async def _health(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        response = await check(health_pb2.HealthCheckRequest(), timeout=5)
        assert isinstance(response, health_pb2.HealthCheckResponse)
        return response.status


async def _error(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    return error.value


async def test_bad_input_is_invalid_argument_naming_the_field(tiny_model: Path, redis_server: RedisServer) -> None:
    async with running_pods(tiny_model, redis_server.url) as pods:
        for num_prompt_tokens, max_tokens, field in [(0, 4, "num_prompt_tokens"), (40, 2000, "max_tokens")]:
            request = decode_pb2.ReserveRequest(
                request_id="r", num_prompt_tokens=num_prompt_tokens, max_tokens=max_tokens
            )
            error = await _error(pods.decode.Reserve(request))
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert [f for f, _ in bad_request_fields(error)] == [field]
        for prompt, first_token_id, field in [(PROMPT, 600, "first_token_id"), ([], 1, "prompt_token_ids")]:
            reserve = await pods.reserve(PROMPT, 40)
            with pytest.raises(DecodeFailed) as failed:
                await read_all(pods.start_decode(prompt, GREEDY, reserve, first_token_id))
            assert failed.value.status.code == code_pb2.INVALID_ARGUMENT
            assert [f for f, _ in bad_request_fields(failed.value.status)] == [field]
        # A failed decode frees its reservation at once (the lease is 10 s).
        await pods.wait_until_idle()
        unknown = decode_pb2.ReserveResponse(kv_target=kv_transfer_pb2.KVTarget(transfer_id="nope"))
        with pytest.raises(DecodeFailed) as failed:
            await read_all(pods.start_decode(PROMPT, GREEDY, unknown, 1))
        assert failed.value.status.code == code_pb2.NOT_FOUND
        await pods.decode.Release(decode_pb2.ReleaseRequest(transfer_id="nope"))


async def test_health_is_not_serving_until_the_engine_is_loaded(
    tiny_model: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    loading = asyncio.Event()
    may_load = asyncio.Event()
    real_start = EngineCoreClient.start

    async def gated_start(client: EngineCoreClient) -> CoreReady:
        loading.set()
        await may_load.wait()
        return await real_start(client)

    monkeypatch.setattr(EngineCoreClient, "start", gated_start)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = f"127.0.0.1:{port}"
    config = decode_main.parse_args(pod_flags(tiny_model, redis_server.url, DECODE_ID, ["--port", str(port)]))
    stop = asyncio.Event()
    pod = asyncio.create_task(decode_main.run_pod(config, stop))
    try:
        await asyncio.wait_for(loading.wait(), 10)
        assert await _health(address) == NOT_SERVING
        async with grpc.aio.insecure_channel(address) as channel:
            stub = decode_pb2_grpc.DecodeServiceStub(channel)
            reserve = decode_pb2.ReserveRequest(request_id="r", num_prompt_tokens=4, max_tokens=4)
            assert (await _error(stub.Reserve(reserve))).code() is grpc.StatusCode.UNAVAILABLE
        may_load.set()
        await _until(lambda: _health(address), SERVING)
    finally:
        stop.set()
        may_load.set()
        assert await asyncio.wait_for(pod, 15) == 0


async def test_registry_entry_and_drain(tiny_model: Path, redis_server: RedisServer) -> None:
    async with running_pods(tiny_model, redis_server.url) as pods:
        decode = pods.pods[DECODE_ID]
        assert (decode.role, decode.model, decode.num_total_blocks, decode.draining) == (
            "decode",
            str(tiny_model),
            64,
            False,
        )
        assert decode.kv_endpoint.startswith("127.0.0.1:") and pods.pods[PREFILL_ID].kv_endpoint == ""
        # A request in flight when the drain starts runs to its end.
        reserve = await pods.reserve(PROMPT, 40)
        prefill_call = pods.start_prefill(PROMPT, GREEDY, reserve)
        first = await prefill_call.read()
        assert isinstance(first, prefill_pb2.PrefillResponse)
        decode_call = pods.start_decode(PROMPT, GREEDY, reserve, first.first_token.token_id)
        first_step = await decode_call.read()
        assert isinstance(first_step, DecodeStep)
        pods.stop.set()
        await pods.wait_for_pod(DECODE_ID, lambda info: info is not None and info.draining, 2.0)
        assert await _health(decode.address) == NOT_SERVING
        error = await _error(pods.reserve(PROMPT, 40))
        assert error.code() is grpc.StatusCode.UNAVAILABLE
        responses = [first_step, *await read_all(decode_call)]
        assert sum(len(r.token_ids) for r in responses) == 39
        assert responses[-1].finish_reason == sampling_pb2.FINISH_REASON_LENGTH
        assert [r.WhichOneof("event") for r in await read_all(prefill_call)] == ["transfer_done"]
        for pod_id in (DECODE_ID, PREFILL_ID):
            await pods.wait_for_pod(pod_id, lambda info: info is None, 5.0)


async def _until(probe: Callable[[], Awaitable[int]], expected: int, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (value := await probe()) != expected:
        assert loop.time() < deadline, f"still {value}"
        await asyncio.sleep(0.02)
