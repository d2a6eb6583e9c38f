"""The public gRPC servicer: decode protobuf, call the router's core, encode protobuf.

Errors are raised as pdserve errors (or a pod's grpc.aio.AioRpcError, passed through) and turned
into statuses with google.rpc details by common.grpc.errors.ErrorInterceptor.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import grpc.aio

from common.errors import InvalidArgumentError
from common.grpc.errors import to_status
from common.metrics import ServiceMetrics
from common.pod_registry import PodInfo
from common.proto_convert import duration_to_pb, finish_reason_to_pb, sampling_params_from_pb, stop_reason_to_pb
from common.sampling_params import SamplingParams
from pdserve.v1 import generation_pb2, generation_pb2_grpc, sampling_pb2
from router.admission.admission import client_id
from router.completion.request_lifecycle import GenerateInput, RequestLifecycle
from router.completion.running_requests import AbortResult, RequestAbortedError, merge_aborts
from router.outputs import CompletionChunk, CompletionMetrics
from router.processes.sibling_aborts import SiblingAborts, is_forwarded
from router.server_status import ServerStatus
from router.tokenizer.tokenizer_pool import ChatMessage

SERVICE_NAME = generation_pb2.DESCRIPTOR.services_by_name["GenerationService"].full_name

Context = grpc.aio.ServicerContext[Any, Any]


class GenerationServicer(generation_pb2_grpc.GenerationServiceServicer):
    """pdserve.v1.GenerationService over a RequestLifecycle; `siblings`: the router's other processes, which Abort
    reaches too (router.processes.sibling_aborts; None: a lone process)."""

    def __init__(
        self,
        lifecycle: RequestLifecycle,
        metrics: ServiceMetrics | None = None,
        status: ServerStatus | None = None,
        siblings: SiblingAborts | None = None,
    ) -> None:
        self._lifecycle = lifecycle
        self._metrics = metrics or ServiceMetrics("router")
        self._status = status or ServerStatus(list, 0, num_running_requests=lambda: len(lifecycle.running))
        self._siblings = siblings

    # NOTE: a coroutine writing its responses (grpc.aio's reader-writer API), not an async generator as the generated
    # base class types it: an Abort cancels this task wherever it waits, writes included, and only a frame that
    # awaits the writes itself can turn that cancellation into the call's status (router.completion.running_requests).
    async def Generate(  # type: ignore[override]
        self, request: generation_pb2.GenerateRequest, context: Context
    ) -> None:
        """Streams the call's responses; an Abort of its request_id ends it with CANCELLED."""
        try:
            call = _generate_input(request, client_id(context.invocation_metadata() or (), context.peer()))
            async with contextlib.aclosing(self._lifecycle.generate(call, context.time_remaining())) as chunks:
                async for chunk in chunks:
                    await context.write(_response(call.request_id, chunk))
        except asyncio.CancelledError:
            if not self._lifecycle.running.absorb_abort():
                raise
            raise RequestAbortedError(f"request {request.request_id!r} was aborted") from None
        except Exception as exc:
            self._metrics.count_router_rejection(to_status(exc).code.name)
            raise

    async def GetModelInfo(
        self, request: generation_pb2.GetModelInfoRequest, context: Context
    ) -> generation_pb2.GetModelInfoResponse:
        return self._model_info()

    async def Abort(self, request: generation_pb2.AbortRequest, context: Context) -> generation_pb2.AbortResponse:
        answers = [self._lifecycle.running.abort(request.request_id)]
        if self._siblings is not None:
            metadata = context.invocation_metadata() or ()
            if not is_forwarded(metadata):
                answers += await self._siblings.abort(request.request_id, metadata)
        result, num_aborted = merge_aborts(answers)
        return generation_pb2.AbortResponse(result=_ABORT_RESULTS[result], num_aborted=num_aborted)

    async def GetServerInfo(
        self, request: generation_pb2.GetServerInfoRequest, context: Context
    ) -> generation_pb2.GetServerInfoResponse:
        status = self._status
        return generation_pb2.GetServerInfoResponse(
            model=self._model_info(),
            roles=status.roles(),
            pods=[_pod_summary(pod) for pod in status.all_pods()],
            num_prefill_pods=status.num_serving_pods("prefill"),
            num_decode_pods=status.num_serving_pods("decode"),
            tokenizer_pool_size=status.tokenizer_pool_size,
            http_port=status.http_port,
            num_router_workers=status.num_router_workers,
        )

    async def GetLoad(self, request: generation_pb2.GetLoadRequest, context: Context) -> generation_pb2.GetLoadResponse:
        return generation_pb2.GetLoadResponse(
            state=_state(self._status.draining),
            num_running_requests=self._status.num_running_requests(),
            router_worker=self._status.router_worker,
            pods=[
                generation_pb2.PodLoad(
                    pod=_pod_summary(pod),
                    state=_state(pod.draining),
                    num_running=pod.num_running,
                    num_waiting=pod.num_waiting,
                    num_free_blocks=pod.num_free_blocks,
                    num_total_blocks=pod.num_total_blocks,
                )
                for pod in self._status.all_pods()
            ],
        )

    def _model_info(self) -> generation_pb2.GetModelInfoResponse:
        model = self._lifecycle.model
        return generation_pb2.GetModelInfoResponse(
            model_id=model.model_id,
            max_model_len=model.max_model_len,
            vocab_size=model.vocab_size,
            block_size=model.block_size,
            eos_token_ids=model.eos_token_ids,
        )

    async def Tokenize(
        self, request: generation_pb2.TokenizeRequest, context: Context
    ) -> generation_pb2.TokenizeResponse:
        which = request.WhichOneof("input")
        token_ids = await self._lifecycle.tokenize(
            request.text if which == "text" else None,
            _chat_messages(request.messages) if which == "messages" else None,
        )
        return generation_pb2.TokenizeResponse(token_ids=token_ids, num_tokens=len(token_ids))


_ABORT_RESULTS = {
    AbortResult.ABORTED: generation_pb2.ABORT_RESULT_ABORTED,
    AbortResult.ALREADY_FINISHED: generation_pb2.ABORT_RESULT_ALREADY_FINISHED,
    AbortResult.NOT_FOUND: generation_pb2.ABORT_RESULT_NOT_FOUND,
}


def _state(draining: bool) -> generation_pb2.ServerState.ValueType:
    return generation_pb2.SERVER_STATE_DRAINING if draining else generation_pb2.SERVER_STATE_SERVING


def _pod_summary(pod: PodInfo) -> generation_pb2.PodSummary:
    return generation_pb2.PodSummary(
        pod_id=pod.pod_id,
        role=pod.role,
        address=pod.address,
        generation=pod.generation,
        draining=pod.draining,
        tensor_parallel_size=pod.tensor_parallel_size,
        pipeline_parallel_size=pod.pipeline_parallel_size,
    )


def _generate_input(request: generation_pb2.GenerateRequest, client: str) -> GenerateInput:
    which = request.WhichOneof("input")
    params = (
        sampling_params_from_pb(request.sampling_params) if request.HasField("sampling_params") else SamplingParams()
    )
    return GenerateInput(
        request_id=request.request_id or uuid.uuid4().hex,
        params=params,
        text=request.text if which == "text" else None,
        messages=_chat_messages(request.messages) if which == "messages" else None,
        token_ids=tuple(request.token_ids.token_ids) if which == "token_ids" else None,
        cache_salt=request.cache_salt if request.HasField("cache_salt") else None,
        client_id=client,
    )


def _chat_messages(messages: generation_pb2.ChatMessages) -> tuple[ChatMessage, ...]:
    return tuple(_chat_message(i, m) for i, m in enumerate(messages.messages))


def _chat_message(index: int, message: generation_pb2.ChatMessage) -> ChatMessage:
    if not message.content_parts:
        return ChatMessage(message.role, message.content)
    field = f"messages.messages[{index}]"
    if message.content:
        raise InvalidArgumentError(f"{field}.content", "must be empty when content_parts is set")
    parts: list[str | bytes] = []
    for j, part in enumerate(message.content_parts):
        which = part.WhichOneof("part")
        if which is None:
            raise InvalidArgumentError(f"{field}.content_parts[{j}]", "set text or image")
        parts.append(part.text if which == "text" else part.image.data)
    return ChatMessage(message.role, "", tuple(parts))


def _response(request_id: str, chunk: CompletionChunk) -> generation_pb2.GenerateResponse:
    response = generation_pb2.GenerateResponse(
        request_id=request_id,
        index=chunk.index,
        text=chunk.text,
        token_ids=chunk.token_ids,
        logprobs=chunk.logprobs,
        finish_reason=finish_reason_to_pb(chunk.finish_reason),
        stop_reason=stop_reason_to_pb(chunk.stop_reason),
    )
    if chunk.cumulative_logprob is not None:
        response.cumulative_logprob = chunk.cumulative_logprob
    if chunk.metrics is not None:
        response.metrics.CopyFrom(_metrics(chunk.metrics))
    if chunk.usage is not None:
        response.usage.CopyFrom(
            sampling_pb2.Usage(
                prompt_tokens=chunk.usage.prompt_tokens,
                completion_tokens=chunk.usage.completion_tokens,
                cached_prompt_tokens=chunk.usage.cached_prompt_tokens,
            )
        )
    return response


def _metrics(metrics: CompletionMetrics) -> generation_pb2.RequestMetrics:
    pb = generation_pb2.RequestMetrics(
        prefill_pod_id=metrics.prefill_pod_id,
        decode_pod_id=metrics.decode_pod_id,
        kv_transfer_bytes=metrics.kv_transfer_bytes,
        kv_transfer_duration=duration_to_pb(metrics.kv_transfer_duration_s),
        time_to_first_token=duration_to_pb(metrics.time_to_first_token_s),
        num_attempts=metrics.num_attempts,
    )
    if metrics.time_to_first_decode_token_s is not None:
        pb.time_to_first_decode_token.CopyFrom(duration_to_pb(metrics.time_to_first_decode_token_s))
    return pb
