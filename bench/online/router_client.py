"""Benchmark clients of a running cluster: through the router, or straight to the pods (no router at all).

Both stream one request to its end and return its `RequestRecord`, stamped with `time.monotonic()` as each
message arrives; the first token is the first message that carries token ids. Greedy sampling, EOS ignored,
so every request produces exactly its `max_tokens`. A failed request is recorded with its error, not raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Sequence

import grpc
import grpc.aio

from bench.online.load_driver import RequestRecord
from bench.reporting.stats import RequestTiming
from bench.workloads import RequestSpec
from client.generation_client import build_request
from common.errors import PdserveError
from common.sampling_params import SamplingParams
from pdserve.v1 import generation_pb2, generation_pb2_grpc
from router.outputs import DecodeRequest, FirstToken, TransferDone
from router.pods.pod_client import PodClient
from router.pods.pod_errors import PodCallFailed

# NOTE: a connection of the channel's own (not gRPC's process-wide subchannel pool), so that each client process
# reaches the router over its own TCP connection, as separate clients would.
_CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]


def _failure(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


class RouterTarget:
    """Generate calls to the router's GenerationService, prompts as token ids (or as text), over `num_connections`
    connections taken in turn (a router of several processes on one port gets each connection's calls in one of
    them: more connections spread a client's calls over its processes, as many clients would)."""

    def __init__(self, address: str, timeout_s: float | None, num_connections: int = 1) -> None:
        self._channels = [
            grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS) for _ in range(max(1, num_connections))
        ]
        self._stubs = [generation_pb2_grpc.GenerationServiceStub(channel) for channel in self._channels]
        self._turns = itertools.count()
        self._stub = self._stubs[0]
        self._timeout_s = timeout_s

    async def __aenter__(self) -> RouterTarget:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def model_info(self) -> generation_pb2.GetModelInfoResponse:
        info: generation_pb2.GetModelInfoResponse = await self._stub.GetModelInfo(
            generation_pb2.GetModelInfoRequest(), timeout=self._timeout_s
        )
        return info

    async def tokenize(self, text: str) -> list[int]:
        response = await self._stub.Tokenize(generation_pb2.TokenizeRequest(text=text), timeout=self._timeout_s)
        return list(response.token_ids)

    async def generate(self, spec: RequestSpec, request_id: str, text: str | None = None) -> RequestRecord:
        """Stream one request; `text` replaces the token ids as the prompt (the router tokenizes it)."""
        request = build_request(
            text,
            token_ids=None if text is not None else spec.prompt_token_ids,
            request_id=request_id,
            max_tokens=spec.max_tokens,
            temperature=0.0,
            ignore_eos=True,
        )
        record = RequestRecord(RequestTiming(time.monotonic()))
        token_times = record.timing.token_times
        try:
            stub = self._stubs[next(self._turns) % len(self._stubs)]
            async for response in stub.Generate(request, timeout=self._timeout_s):
                now = time.monotonic()
                token_times.extend(now for _ in response.token_ids)
                if response.HasField("usage"):
                    record.num_prompt_tokens = response.usage.prompt_tokens
                    record.num_cached_tokens = response.usage.cached_prompt_tokens
                if response.HasField("metrics"):
                    metrics = response.metrics
                    record.server_ttft_s = metrics.time_to_first_token.ToNanoseconds() / 1e9
                    record.kv_transfer_bytes = metrics.kv_transfer_bytes
                    record.kv_transfer_s = metrics.kv_transfer_duration.ToNanoseconds() / 1e9
        except grpc.aio.AioRpcError as exc:
            record.error = _failure(exc)
        return record

    async def aclose(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self._channels))


class PodDirectTarget:
    """The router's pod calls made by the client itself: Reserve on a decode pod, Prefill with that KV target on a
    prefill pod, then decoding on the decode pod's DecodeStream (one per client process), while the rest of the
    Prefill stream (the KV transfer's end) is read beside it. Pods are taken round robin. No tokenizing, routing,
    detokenizing or extra hop: the baseline that the router's overhead is measured against."""

    def __init__(
        self, prefill_addresses: Sequence[str], decode_addresses: Sequence[str], timeout_s: float | None
    ) -> None:
        if not prefill_addresses or not decode_addresses:
            raise ValueError("direct pod calls need at least one prefill and one decode pod")
        self._prefill = [PodClient(f"prefill@{a}", a) for a in prefill_addresses]
        self._decode = [PodClient(f"decode@{a}", a) for a in decode_addresses]
        self._turns = itertools.count()
        self._timeout_s = timeout_s

    async def __aenter__(self) -> PodDirectTarget:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def generate(self, spec: RequestSpec, request_id: str) -> RequestRecord:
        turn = next(self._turns)
        prefill, decode = self._prefill[turn % len(self._prefill)], self._decode[turn % len(self._decode)]
        record = RequestRecord(RequestTiming(time.monotonic()), num_prompt_tokens=len(spec.prompt_token_ids))
        try:
            await self._stream(prefill, decode, spec, request_id, record)
        except (grpc.aio.AioRpcError, PdserveError, PodCallFailed, RuntimeError, StopAsyncIteration) as exc:
            record.error = _failure(exc)
        return record

    async def _stream(
        self, prefill: PodClient, decode: PodClient, spec: RequestSpec, request_id: str, record: RequestRecord
    ) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=spec.max_tokens, ignore_eos=True)
        prompt, timeout = spec.prompt_token_ids, self._timeout_s
        reservation = await decode.reserve(request_id, len(prompt), spec.max_tokens, timeout)
        stream = prefill.prefill(request_id, prompt, params, reservation, None, timeout)
        async with contextlib.aclosing(stream):
            first = await anext(stream)
            record.timing.token_times.append(time.monotonic())
            if not isinstance(first, FirstToken):
                raise RuntimeError(f"prefill pod {prefill.address} sent no first token")
            record.num_cached_tokens = first.num_cached_tokens
            if spec.max_tokens == 1:
                await decode.release(reservation.transfer_id, timeout)
                return
            transfer = asyncio.create_task(_transfer_done(stream))
            try:
                steps = decode.decode(
                    DecodeRequest(request_id, reservation.transfer_id, prompt, first.token_id, params, None)
                )
                async for step in steps:
                    now = time.monotonic()
                    record.timing.token_times.extend(now for _ in step.token_ids)
                done = await transfer
            finally:
                transfer.cancel()
        record.kv_transfer_bytes, record.kv_transfer_s = done.num_bytes, done.duration_s

    async def aclose(self) -> None:
        await asyncio.gather(*(client.aclose() for client in [*self._prefill, *self._decode]))


async def _transfer_done(stream: AsyncIterator[FirstToken | TransferDone]) -> TransferDone:
    async for event in stream:
        if isinstance(event, TransferDone):
            return event
    raise RuntimeError("the Prefill stream ended without TransferDone")
