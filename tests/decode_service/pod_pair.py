"""A prefill pod and a decode pod in the test's event loop (real gRPC servers, real tcp KV transfer, real Redis),
driven the way the router drives them: Reserve -> Prefill -> Decode. Shared by the prefill and decode tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar, cast

import grpc.aio
import pytest
from google.rpc import status_pb2

import decode_service.__main__ as decode_main
import prefill_service.__main__ as prefill_main
from cli.redis_server import RedisServer
from common.pod_registry import PodInfo, PodRegistry
from common.telemetry import context_carrier
from pdserve.v1 import decode_pb2, decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc, sampling_pb2
from tests.engine.model_factory import save_tiny_model

PREFILL_ID = "prefill-test"
DECODE_ID = "decode-test"
BLOCK_SIZE = 16

R = TypeVar("R")
PrefillCall = grpc.aio.UnaryStreamCall[prefill_pb2.PrefillRequest, prefill_pb2.PrefillResponse]


class Readable(Protocol[R]):
    async def read(self) -> R | grpc.aio.EOFType: ...


@dataclass
class DecodeStep:
    """One DecodeStream message's share for one request."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: int = sampling_pb2.FINISH_REASON_UNSPECIFIED
    stop_reason: sampling_pb2.StopReason | None = None


class DecodeFailed(Exception):
    """The request's DecodeEnd carried an error."""

    def __init__(self, status: status_pb2.Status) -> None:
        super().__init__(status.message)
        self.status = status


class OneDecode:
    """One request on a DecodeStream of its own, read step by step (`read`, then EOF after its end); `cancel()`
    ends the stream, and with it the request."""

    KEY = 1

    def __init__(self, stub: decode_pb2_grpc.DecodeServiceAsyncStub, start: decode_pb2.DecodeStart) -> None:
        self._frames: asyncio.Queue[decode_pb2.DecodeStreamRequest | None] = asyncio.Queue()
        self._frames.put_nowait(decode_pb2.DecodeStreamRequest(start=start))
        self._call = stub.DecodeStream(self._requests())
        self._ended = False

    async def _requests(self) -> AsyncIterator[decode_pb2.DecodeStreamRequest]:
        while (frame := await self._frames.get()) is not None:
            yield frame

    async def read(self) -> DecodeStep | grpc.aio.EOFType:
        if self._ended:
            self._call.cancel()
            return grpc.aio.EOF
        message = await self._call.read()
        assert isinstance(message, decode_pb2.DecodeStreamResponse), f"the stream ended: {message}"
        assert set(message.keys) <= {self.KEY}
        step = DecodeStep(list(message.token_ids), list(message.logprobs))
        for end in message.ends:
            self._ended = True
            if end.HasField("error"):
                self._call.cancel()
                raise DecodeFailed(end.error)
            step.finish_reason = end.finish_reason
            step.stop_reason = end.stop_reason if end.HasField("stop_reason") else None
        return step

    def cancel(self) -> None:
        self._call.cancel()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight qwen3 checkpoint (vocab 512, 2 layers); the engine needs no tokenizer."""
    return save_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3"))


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Flow:
    """What one request's Reserve -> Prefill -> Decode produced."""

    reserve: decode_pb2.ReserveResponse
    prefill: list[prefill_pb2.PrefillResponse] = field(default_factory=list)
    decode: list[DecodeStep] = field(default_factory=list)

    @property
    def token_ids(self) -> list[int]:
        """The first token (from prefill) and every decoded one."""
        return [self.prefill[0].first_token.token_id, *(t for r in self.decode for t in r.token_ids)]


@dataclass
class PodPair:
    prefill: prefill_pb2_grpc.PrefillServiceAsyncStub
    decode: decode_pb2_grpc.DecodeServiceAsyncStub
    registry: PodRegistry
    pods: dict[str, PodInfo]
    stop: asyncio.Event
    tasks: list[asyncio.Task[int]]

    async def pod(self, pod_id: str) -> PodInfo | None:
        return next((p for p in await self.registry.list_pods() if p.pod_id == pod_id), None)

    async def wait_for_pod(self, pod_id: str, check: Callable[[PodInfo | None], bool], timeout_s: float) -> float:
        """Poll the registry until `check(entry)` holds; returns the seconds it took (fails after timeout_s)."""
        start = time.monotonic()
        while not check(info := await self.pod(pod_id)):
            assert time.monotonic() - start < timeout_s, f"{pod_id} never got there; last entry: {info}"
            await asyncio.sleep(0.02)
        return time.monotonic() - start

    async def wait_until_idle(self, timeout_s: float = 2.0) -> None:
        """Both pods' heartbeats report every block free and nothing running."""
        for pod_id in (PREFILL_ID, DECODE_ID):
            await self.wait_for_pod(pod_id, _idle, timeout_s)

    async def reserve(self, prompt: Sequence[int], max_tokens: int) -> decode_pb2.ReserveResponse:
        return await self.decode.Reserve(
            decode_pb2.ReserveRequest(request_id="req", num_prompt_tokens=len(prompt), max_tokens=max_tokens)
        )

    async def release(self, reserve: decode_pb2.ReserveResponse) -> None:
        await self.decode.Release(decode_pb2.ReleaseRequest(transfer_id=reserve.kv_target.transfer_id))

    def start_prefill(
        self, prompt: Sequence[int], params: sampling_pb2.SamplingParams, reserve: decode_pb2.ReserveResponse
    ) -> PrefillCall:
        request = prefill_pb2.PrefillRequest(
            request_id="req", prompt_token_ids=prompt, sampling_params=params, kv_target=reserve.kv_target
        )
        return self.prefill.Prefill(request)

    def start_decode(
        self,
        prompt: Sequence[int],
        params: sampling_pb2.SamplingParams,
        reserve: decode_pb2.ReserveResponse,
        first_token_id: int,
    ) -> OneDecode:
        start = decode_pb2.DecodeStart(
            key=OneDecode.KEY,
            request_id="req",
            transfer_id=reserve.kv_target.transfer_id,
            prompt_token_ids=prompt,
            first_token_id=first_token_id,
            sampling_params=params,
            trace_context=context_carrier(),
        )
        return OneDecode(self.decode, start)

    async def generate(
        self,
        prompt: Sequence[int],
        params: sampling_pb2.SamplingParams,
        reserve: decode_pb2.ReserveResponse | None = None,
    ) -> Flow:
        """The router's flow: Reserve (unless given), Prefill; Decode as soon as the first token is known."""
        flow = Flow(reserve or await self.reserve(prompt, params.max_tokens))
        prefill_call = self.start_prefill(prompt, params, flow.reserve)
        first = await prefill_call.read()
        assert isinstance(first, prefill_pb2.PrefillResponse)
        flow.prefill.append(first)
        decode_call = self.start_decode(prompt, params, flow.reserve, first.first_token.token_id)

        rest, flow.decode = await asyncio.gather(read_all(prefill_call), read_all(decode_call))
        flow.prefill.extend(rest)
        return flow


async def read_all(call: Readable[R]) -> list[R]:
    """Every (remaining) message of a stream, read with `read()`."""
    responses: list[R] = []
    while (response := await call.read()) is not grpc.aio.EOF:
        responses.append(cast(R, response))
    return responses


def _idle(info: PodInfo | None) -> bool:
    return (
        info is not None
        and info.num_free_blocks == info.num_total_blocks
        and info.num_running == 0
        and info.num_waiting == 0
    )


def pod_flags(model: Path, redis_url: str, pod_id: str, extra: Sequence[str]) -> list[str]:
    return [
        "--model",
        str(model),
        "--redis-url",
        redis_url,
        "--pod-id",
        pod_id,
        "--heartbeat-s",
        "0.05",
        "--num-blocks",
        "64",
        "--long-prefill-token-threshold",
        "16",
        "--drain-timeout-s",
        "10",
        *extra,
    ]


@asynccontextmanager
async def running_pods(
    model: Path,
    redis_url: str,
    prefill_flags: Sequence[str] = (),
    decode_flags: Sequence[str] = (),
    interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
) -> AsyncIterator[PodPair]:
    """Start both pods (each with the shared flags plus its own), yield once both are registered and SERVING, then
    stop (drain) them and check they exited 0. The stubs' channels use `interceptors` (e.g. tracing ones)."""
    stop = asyncio.Event()
    prefill_config = prefill_main.parse_args(pod_flags(model, redis_url, PREFILL_ID, prefill_flags))
    decode_config = decode_main.parse_args(pod_flags(model, redis_url, DECODE_ID, decode_flags))
    tasks = [
        asyncio.create_task(prefill_main.run_pod(prefill_config, stop)),
        asyncio.create_task(decode_main.run_pod(decode_config, stop)),
    ]
    registry = PodRegistry(redis_url)
    try:
        pods = await _wait_for_registration(registry, tasks)
        async with (
            grpc.aio.insecure_channel(pods[PREFILL_ID].address, interceptors=interceptors) as prefill_channel,
            grpc.aio.insecure_channel(pods[DECODE_ID].address, interceptors=interceptors) as decode_channel,
        ):
            yield PodPair(
                prefill_pb2_grpc.PrefillServiceStub(prefill_channel),
                decode_pb2_grpc.DecodeServiceStub(decode_channel),
                registry,
                pods,
                stop,
                tasks,
            )
        stop.set()
        assert await asyncio.wait_for(asyncio.gather(*tasks), 15) == [0, 0]
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await registry.aclose()


async def _wait_for_registration(registry: PodRegistry, tasks: list[asyncio.Task[int]]) -> dict[str, PodInfo]:
    deadline = time.monotonic() + 30
    while len(pods := {p.pod_id: p for p in await registry.list_pods()}) < 2:
        failed = [t for t in tasks if t.done()]
        if failed:
            failed[0].result()
        assert time.monotonic() < deadline, f"pods never registered: {pods}"
        await asyncio.sleep(0.02)
    return pods
