"""What the server interceptors (auth, errors, tracing) share: each looks at a method's handler once it is found
(HandlerInterceptor) and may rebuild it around another behavior, same kind, same (de)serializers (`with_behavior`),
to refuse, wrap or trace a call without knowing the method."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

_HANDLER_KINDS: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler[Any, Any]]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def with_behavior(
    handler: grpc.RpcMethodHandler[Any, Any],
    behavior: Callable[..., Any],
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same kind as `handler` (request and response streaming or not) that runs `behavior`, with
    `handler`'s serializers (its request deserializer replaced by `request_deserializer`, when given)."""
    make = _HANDLER_KINDS[(handler.request_streaming, handler.response_streaming)]
    return make(
        behavior,
        request_deserializer=request_deserializer or handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class HandlerInterceptor(grpc.aio.ServerInterceptor, ABC):
    """A server interceptor that looks at each call's method handler once it is found and returns it, or one it
    built in its place (see `with_behavior`); a method with no handler stays without one."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        return None if handler is None else self.intercept_handler(handler, handler_call_details)

    @abstractmethod
    def intercept_handler(
        self, handler: grpc.RpcMethodHandler[Any, Any], handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """The handler that serves the call: `handler` itself, or one built around it."""
