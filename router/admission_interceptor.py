"""The router's door: Generate calls it would refuse anyway are turned away before they cost anything.

A refusal must come in milliseconds even when hundreds of calls arrive at once, and the router's one event loop is
what they wait for. So the first interceptor after authentication asks `RouterAdmission.check_open` (draining? queue
full?) before the method's handler is even looked up: a refused call is never read, gets no tracing span and no
servicer task, and ends at once with the status of the refusal (UNAVAILABLE or RESOURCE_EXHAUSTED, each with its
RetryInfo, as common.grpc_errors reports them), counted in the router's rejection metric. A call let in meets the
same checks again in the lifecycle (with the per-client limit, which needs the call's peer), and the HTTP API meets
them there only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from common.errors import PdserveError
from common.grpc_errors import to_status
from common.metrics import ServiceMetrics
from pdserve.v1 import generation_pb2
from router.admission import RouterAdmission

GENERATE_METHOD = "/{}/Generate".format(generation_pb2.DESCRIPTOR.services_by_name["GenerationService"].full_name)


class AdmissionInterceptor(grpc.aio.ServerInterceptor):
    """Refuses a Generate call at once while `admission.check_open` does; every other call passes untouched."""

    def __init__(self, admission: RouterAdmission, metrics: ServiceMetrics) -> None:
        self._admission = admission
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        if handler_call_details.method == GENERATE_METHOD:
            try:
                self._admission.check_open()
            except PdserveError as exc:
                return self._refusing(to_status(exc))
        return await continuation(handler_call_details)

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
