"""Three tiny services over real grpc.aio servers, chained like pdserve's: a router-like GenerationService that
calls a decode-like DecodeService (Reserve, Decode) and a prefill-like PrefillService (Prefill), each process with
its own `Tracing` and the standard services (health, reflection).

Per Generate call the spans are (parent <- child): router SERVER Generate <- router "route" (INTERNAL),
router CLIENT Reserve <- decode SERVER Reserve, router CLIENT Prefill <- prefill SERVER Prefill <- "engine.prefill"
(opened on an executor thread from a captured context), router CLIENT Decode <- decode SERVER Decode <- "decode.batch".
Request id "full" makes Reserve fail with RESOURCE_EXHAUSTED; "hang" makes Decode wait after its first token.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import grpc.aio
from grpc_health.v1 import health_pb2

from common.errors import ResourceExhaustedError
from common.grpc.errors import ErrorInterceptor
from common.grpc.server import add_standard_services
from common.telemetry import (
    EVENT_FIRST_TOKEN,
    GEN_AI_OPERATION_NAME,
    GEN_AI_OPERATION_TEXT_COMPLETION,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_REQUEST_TEMPERATURE,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    PDSERVE_PREFILL_POD,
    PDSERVE_REQUEST_ID,
    Attributes,
    Tracing,
    add_event,
    attach,
    capture_context,
    context_carrier,
    context_from_carrier,
    set_attributes,
)
from pdserve.v1 import (
    decode_pb2,
    decode_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
    kv_transfer_pb2,
    prefill_pb2,
    prefill_pb2_grpc,
    sampling_pb2,
)

Context = grpc.aio.ServicerContext[Any, Any]
FIRST_TOKEN = 10
DECODE_TOKENS = (11, 12)
EVENT_RESERVED = "reserved"


class DecodeLike(decode_pb2_grpc.DecodeServiceServicer):
    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing
        self.metadata_keys: list[tuple[str, ...]] = []
        self.cancelled = asyncio.Event()

    async def Reserve(self, request: decode_pb2.ReserveRequest, context: Context) -> decode_pb2.ReserveResponse:
        self.metadata_keys.append(tuple(key for key, _ in context.invocation_metadata() or ()))
        if request.request_id == "full":
            raise ResourceExhaustedError("no KV blocks")
        add_event(EVENT_RESERVED, {"num_blocks": 2})
        return decode_pb2.ReserveResponse(kv_target=kv_transfer_pb2.KVTarget(transfer_id=f"t-{request.request_id}"))

    async def DecodeStream(
        self, request_iterator: AsyncIterator[decode_pb2.DecodeStreamRequest], context: Context
    ) -> AsyncIterator[decode_pb2.DecodeStreamResponse]:
        """One request per stream here: its tokens under a "decode.batch" span in the DecodeStart's trace. Request
        "hang" stops after one token until its stream is cancelled (then `cancelled` is set)."""
        frame = await anext(aiter(request_iterator))
        start = frame.start
        with self._tracing.tracer.start_as_current_span(
            "decode.batch",
            context=context_from_carrier(start.trace_context),
            attributes={PDSERVE_REQUEST_ID: start.request_id},
        ):
            for index, token_id in enumerate(DECODE_TOKENS):
                message = decode_pb2.DecodeStreamResponse(
                    keys=[start.key], num_tokens=[1], token_ids=[token_id], num_logprobs=[0]
                )
                if index == len(DECODE_TOKENS) - 1:
                    message.ends.add(key=start.key, finish_reason=sampling_pb2.FINISH_REASON_STOP)
                yield message
                if start.request_id == "hang":
                    try:
                        await asyncio.Event().wait()
                    finally:
                        self.cancelled.set()

    async def Release(self, request: decode_pb2.ReleaseRequest, context: Context) -> decode_pb2.ReleaseResponse:
        return decode_pb2.ReleaseResponse()


class PrefillLike(prefill_pb2_grpc.PrefillServiceServicer):
    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing

    async def Prefill(self, request: prefill_pb2.PrefillRequest, context: Context) -> AsyncIterator[Any]:
        """Async generator style; the "engine" runs on an executor thread, which does not inherit contextvars."""
        ctx = capture_context()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._engine_step, ctx, request.request_id)
        yield prefill_pb2.PrefillResponse(first_token=prefill_pb2.FirstToken(token_id=FIRST_TOKEN))
        yield prefill_pb2.PrefillResponse(transfer_done=prefill_pb2.TransferDone(num_blocks=2, num_bytes=4096))

    def _engine_step(self, ctx: Any, request_id: str) -> None:
        with attach(ctx), self._tracing.span("engine.prefill", {PDSERVE_REQUEST_ID: request_id}):
            add_event(EVENT_FIRST_TOKEN)


class RouterLike(generation_pb2_grpc.GenerationServiceServicer):
    def __init__(self, tracing: Tracing, prefill: grpc.aio.Channel, decode: grpc.aio.Channel) -> None:
        self._tracing = tracing
        self._prefill_health = health_check(prefill)
        self._prefill = prefill_pb2_grpc.PrefillServiceStub(prefill)
        self._decode = decode_pb2_grpc.DecodeServiceStub(decode)

    async def Generate(self, request: generation_pb2.GenerateRequest, context: Context) -> AsyncIterator[Any]:
        request_id = request.request_id
        attributes: Attributes = {
            GEN_AI_OPERATION_NAME: GEN_AI_OPERATION_TEXT_COMPLETION,
            GEN_AI_REQUEST_MODEL: "test-model",
            GEN_AI_REQUEST_MAX_TOKENS: 3,
            GEN_AI_REQUEST_TEMPERATURE: None,
            PDSERVE_PREFILL_POD: "prefill-0",
        }
        with self._tracing.span("route", attributes):
            await self._prefill_health(health_pb2.HealthCheckRequest())
        reserved = await self._decode.Reserve(decode_pb2.ReserveRequest(request_id=request_id, num_prompt_tokens=3))
        prefill = prefill_pb2.PrefillRequest(request_id=request_id, kv_target=reserved.kv_target)
        async for event in self._prefill.Prefill(prefill):
            if event.HasField("first_token"):
                yield generation_pb2.GenerateResponse(request_id=request_id, token_ids=[event.first_token.token_id])
        start = decode_pb2.DecodeStart(
            key=1, request_id=request_id, transfer_id=reserved.kv_target.transfer_id, trace_context=context_carrier()
        )
        stream = self._decode.DecodeStream(iter([decode_pb2.DecodeStreamRequest(start=start)]))
        async for step in stream:
            yield generation_pb2.GenerateResponse(request_id=request_id, token_ids=list(step.token_ids))
            if step.ends:
                break
        set_attributes({GEN_AI_USAGE_OUTPUT_TOKENS: 1 + len(DECODE_TOKENS), GEN_AI_RESPONSE_FINISH_REASONS: ["stop"]})

    async def GetModelInfo(
        self, request: generation_pb2.GetModelInfoRequest, context: Context
    ) -> generation_pb2.GetModelInfoResponse:
        return generation_pb2.GetModelInfoResponse()

    async def Tokenize(
        self, request: generation_pb2.TokenizeRequest, context: Context
    ) -> generation_pb2.TokenizeResponse:
        return generation_pb2.TokenizeResponse()


def health_check(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable[Any, Any]:
    """grpc.health.v1 Check on `channel` (by method path: the health stubs do not type HealthStub's methods)."""
    return channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )


async def serve(
    stack: AsyncExitStack, tracing: Tracing, add: Callable[[grpc.aio.Server], None], service_name: str
) -> str:
    """Start a server with the tracing interceptor first (then the error interceptor); returns its address."""
    server = grpc.aio.server(interceptors=[*tracing.server_interceptors(), ErrorInterceptor()])
    add(server)
    health = add_standard_services(server, [service_name])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await health.set_serving()
    stack.push_async_callback(server.stop, None)
    return f"127.0.0.1:{port}"


@dataclass(slots=True, frozen=True)
class Chain:
    router_address: str
    decode: DecodeLike


async def start_chain(stack: AsyncExitStack, router: Tracing, prefill: Tracing, decode: Tracing) -> Chain:
    """Start decode, prefill and router services; everything stops with `stack`."""
    decode_servicer = DecodeLike(decode)
    decode_address = await serve(
        stack,
        decode,
        lambda s: decode_pb2_grpc.add_DecodeServiceServicer_to_server(decode_servicer, s),
        "pdserve.v1.DecodeService",
    )
    prefill_address = await serve(
        stack,
        prefill,
        lambda s: prefill_pb2_grpc.add_PrefillServiceServicer_to_server(PrefillLike(prefill), s),
        "pdserve.v1.PrefillService",
    )
    interceptors = router.client_interceptors()
    prefill_channel = grpc.aio.insecure_channel(prefill_address, interceptors=interceptors)
    decode_channel = grpc.aio.insecure_channel(decode_address, interceptors=interceptors)
    stack.push_async_callback(prefill_channel.close)
    stack.push_async_callback(decode_channel.close)
    servicer = RouterLike(router, prefill_channel, decode_channel)
    router_address = await serve(
        stack,
        router,
        lambda s: generation_pb2_grpc.add_GenerationServiceServicer_to_server(servicer, s),
        "pdserve.v1.GenerationService",
    )
    return Chain(router_address, decode_servicer)
