"""The router's door: Generate calls it would refuse anyway are turned away before they cost anything.

A refusal must come in milliseconds even when hundreds of calls arrive at once, and the router's one event loop is
what they wait for. So the first interceptor after authentication asks `RouterAdmission.enter` (draining? queue
full?) before the method's handler is even looked up: a refused call is never read, gets no tracing span and no
servicer task, and ends at once with the status of the refusal (UNAVAILABLE or RESOURCE_EXHAUSTED, each with its
RetryInfo, as common.grpc_errors reports them), counted in the router's rejection metric. A call let in holds a
place in the queue from here on (its DoorPass, router.admission), so that the calls of a burst beyond the queue are
refused here too, not after tokenizing; its handler runs with the pass in its context and gives it back when it
ends, if the lifecycle has not taken it over. Let in while calls arrive in a burst or while the queue is a quarter
full, it waits for the arrivals to pause before it starts (router.door_burst), so that the door answers first. It
meets the same checks again in the lifecycle (with the per-client limit, which needs the call's peer), and the HTTP
API meets them there only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import grpc
import grpc.aio

from common.errors import PdserveError
from common.grpc_errors import to_status
from common.metrics import ServiceMetrics
from pdserve.v1 import generation_pb2
from router.admission import DOOR_PASS, DoorPass, RouterAdmission
from router.door_burst import DoorBurst

GENERATE_METHOD = "/{}/Generate".format(generation_pb2.DESCRIPTOR.services_by_name["GenerationService"].full_name)


class AdmissionInterceptor(grpc.aio.ServerInterceptor):
    """Refuses a Generate call at once while `admission.enter` does, and lets the others in holding their place in
    the queue; every other call passes untouched."""

    def __init__(self, admission: RouterAdmission, metrics: ServiceMetrics, burst: DoorBurst | None = None) -> None:
        self._admission = admission
        self._metrics = metrics
        self._burst = burst or DoorBurst()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        if handler_call_details.method != GENERATE_METHOD:
            return await continuation(handler_call_details)
        crowded = self._burst.arrived() or self._admission.filling()
        try:
            door_pass = self._admission.enter()
        except PdserveError as exc:
            return self._refusing(to_status(exc))
        try:
            handler = await continuation(handler_call_details)
        except BaseException:
            door_pass.release()
            raise
        if handler is None:
            door_pass.release()
            return None
        return _holding(handler, door_pass, self._burst if crowded else None)

    def _refusing(self, status: grpc.Status) -> grpc.RpcMethodHandler[Any, Any]:
        """A handler that ends its call with `status` without reading its request.

        NOTE: filed as request-streaming, so that gRPC calls it at once instead of first awaiting the request message
        (a round trip through gRPC's completion queue per call); on the wire a status is a status, whatever the
        handler's kind, and the client's unary-stream call ends with it.
        """
        self._metrics.count_router_rejection(status.code.name)

        async def refuse(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> None:
            context.set_code(status.code)
            context.set_details(status.details)
            context.set_trailing_metadata(status.trailing_metadata)

        return grpc.stream_stream_rpc_method_handler(refuse)


def _holding(
    handler: grpc.RpcMethodHandler[Any, Any], door_pass: DoorPass, burst: DoorBurst | None
) -> grpc.RpcMethodHandler[Any, Any]:
    """`handler` (a unary-stream method's, its behavior a coroutine that writes its responses) run with `door_pass` in
    its context, which it gives back when it ends, once a burst at the door has passed (router.door_burst).

    NOTE: filed as request-streaming, as `_refusing` is, so that gRPC calls it at once: a unary-stream handler is
    called only once its request arrived, and a call cancelled before that would never give its place back.
    """
    # NOTE: the error interceptor after this one makes every unary-stream behavior a coroutine (common.grpc_errors).
    behavior = cast(Callable[..., Awaitable[None]], handler.unary_stream)

    async def serve(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> None:
        token = DOOR_PASS.set(door_pass)
        try:
            if burst is not None:
                await burst.settled()
            request = await context.read()
            if request is grpc.aio.EOF:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request: no request message was sent")
            await behavior(request, context)
        finally:
            door_pass.release()
            DOOR_PASS.reset(token)

    return grpc.stream_stream_rpc_method_handler(
        serve, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )
