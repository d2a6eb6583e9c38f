"""Exceptions to gRPC status codes with google.rpc rich details, in one place.

Servicers raise; `ErrorInterceptor` (or `abort_with`, for code that catches) reports the exception:
- `InvalidArgumentError` -> INVALID_ARGUMENT + `google.rpc.BadRequest` naming the request field path;
- `ResourceExhaustedError` -> RESOURCE_EXHAUSTED + `google.rpc.RetryInfo` (its `retry_after_s`, else the default);
- `UnavailableError` -> UNAVAILABLE;
- any other `PdserveError` -> the status its class names (e.g. a KV `TransferError` -> ABORTED, NOT_FOUND or
  FAILED_PRECONDITION), its message as the details;
- any `PdserveError` with a `retry_after_s` also carries it as a `google.rpc.RetryInfo`, rounded to milliseconds;
- `RemoteError` (another service's answer, e.g. a pod's) and `grpc.aio.AioRpcError` (a call to another pod failed)
  -> its status and details, passed through;
- anything else -> INTERNAL, logged with its traceback.
Clients read the field violations back with `bad_request_fields`, a retry delay with `retry_delay_s`.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import grpc
import grpc.aio
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from common.errors import InvalidArgumentError, PdserveError, RemoteError, ResourceExhaustedError, UnavailableError
from common.grpc.handlers import HandlerInterceptor, with_behavior
from common.grpc.request_parsing import UnparsedRequest, tolerant_deserializer
from pdserve.v1 import sampling_pb2

logger = logging.getLogger(__name__)

_STATUS_DETAILS_KEY = "grpc-status-details-bin"

DEFAULT_RETRY_DELAY_S = 1.0
"""Retry delay advertised in google.rpc.RetryInfo when a service is out of capacity."""

FIELD_PATHS: Mapping[str, str] = {
    "prompt": "text",
    **{f.name: f"sampling_params.{f.name}" for f in sampling_pb2.SamplingParams.DESCRIPTOR.fields},
}
"""Engine field names -> field paths of the requests that carry them (GenerateRequest, PrefillRequest,
DecodeRequest). Names not in the table are reported as they are."""


def to_status(
    exc: Exception,
    field_paths: Mapping[str, str] = FIELD_PATHS,
    retry_delay_s: float = DEFAULT_RETRY_DELAY_S,
) -> grpc.Status:
    """The status (with rich details in its trailing metadata) that reports `exc` to the caller."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return _passed_through(exc)
    return rpc_status.to_status(rich_status(exc, field_paths, retry_delay_s))


def rich_status(
    exc: Exception,
    field_paths: Mapping[str, str] = FIELD_PATHS,
    retry_delay_s: float = DEFAULT_RETRY_DELAY_S,
) -> status_pb2.Status:
    """The google.rpc.Status that reports `exc` (see the module docstring), e.g. inside a stream's message."""
    if isinstance(exc, RemoteError):
        if exc.rich_status:
            return status_pb2.Status.FromString(exc.rich_status)
        return status_pb2.Status(code=code_pb2.Code.Value(exc.code), message=str(exc))
    if isinstance(exc, InvalidArgumentError):
        field = field_paths.get(exc.field, exc.field)
        violation = error_details_pb2.BadRequest.FieldViolation(field=field, description=exc.description)
        detail = error_details_pb2.BadRequest(field_violations=[violation])
        return _rich(code_pb2.INVALID_ARGUMENT, f"{field}: {exc.description}", detail)
    if isinstance(exc, ResourceExhaustedError):
        retry_after_s = retry_delay_s if exc.retry_after_s is None else exc.retry_after_s
        return _rich(code_pb2.RESOURCE_EXHAUSTED, str(exc) or "out of capacity", _retry_info(retry_after_s))
    if isinstance(exc, UnavailableError):
        return _rich(code_pb2.UNAVAILABLE, str(exc) or "no healthy pod", _retry_info(exc.retry_after_s))
    if isinstance(exc, PdserveError) and exc.status != "INTERNAL":
        return _rich(code_pb2.Code.Value(exc.status), str(exc), _retry_info(exc.retry_after_s))
    return _rich(code_pb2.INTERNAL, "internal error", None)


async def abort_with(
    context: grpc.aio.ServicerContext[Any, Any],
    exc: Exception,
    field_paths: Mapping[str, str] = FIELD_PATHS,
    retry_delay_s: float = DEFAULT_RETRY_DELAY_S,
) -> NoReturn:
    """Ends the RPC with the status that reports `exc` (see the module docstring); never returns."""
    status = to_status(exc, field_paths, retry_delay_s)
    if status.code is grpc.StatusCode.INTERNAL and not isinstance(exc, grpc.aio.AioRpcError):
        logger.error("unhandled %s in a gRPC handler", type(exc).__name__, exc_info=exc)
    await context.abort(status.code, status.details, status.trailing_metadata)


def bad_request_fields(error: grpc.aio.AioRpcError | status_pb2.Status) -> list[tuple[str, str]]:
    """(field path, description) of every google.rpc.BadRequest field violation the error carries."""
    fields: list[tuple[str, str]] = []
    for detail in _details(error):
        bad_request = error_details_pb2.BadRequest()
        if detail.Unpack(bad_request):
            fields.extend((v.field, v.description) for v in bad_request.field_violations)
    return fields


def retry_delay_s(error: grpc.aio.AioRpcError | grpc.Call | status_pb2.Status) -> float | None:
    """The google.rpc.RetryInfo delay (seconds) the error carries; None when it carries none."""
    for detail in _details(error):
        retry_info = error_details_pb2.RetryInfo()
        if detail.Unpack(retry_info):
            return retry_info.retry_delay.ToNanoseconds() / 1e9
    return None


_Behavior = Callable[..., Any]


_MAX_WRAPPED_HANDLERS = 256
"""Method handlers whose wrapped handler ErrorInterceptor keeps (far more than any server's methods)."""


class ErrorInterceptor(HandlerInterceptor):
    """Server interceptor that reports whatever an async unary, server-streaming or bidirectional-streaming handler
    raises through `abort_with`, so servicers simply raise. A unary request message that does not parse reaches no
    handler: it is reported as INVALID_ARGUMENT (`common.grpc.request_parsing`); a bidirectional handler gets such a
    message as an `UnparsedRequest` to report. Sync and client-streaming handlers pass through untouched."""

    def __init__(
        self, field_paths: Mapping[str, str] = FIELD_PATHS, retry_delay_s: float = DEFAULT_RETRY_DELAY_S
    ) -> None:
        self._field_paths = field_paths
        self._retry_delay_s = retry_delay_s
        self._wrapped: dict[grpc.RpcMethodHandler[Any, Any], grpc.RpcMethodHandler[Any, Any]] = {}
        """Each method handler's wrapped one, built on its first call. NOTE: servers look their handlers up in
        fixed tables (one handler object per method), so this holds one entry per method; an interceptor placed
        before this one may build a handler per call, hence the bound."""

    def intercept_handler(
        self, handler: grpc.RpcMethodHandler[Any, Any], handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any]:
        wrapped = self._wrapped.get(handler)
        if wrapped is None:
            wrapped = self._wrap_handler(handler)
            if len(self._wrapped) < _MAX_WRAPPED_HANDLERS:
                self._wrapped[handler] = wrapped
        return wrapped

    def _wrap_handler(self, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        deserializer = tolerant_deserializer(handler.request_deserializer)
        if handler.request_streaming:
            if not (handler.response_streaming and inspect.isasyncgenfunction(handler.stream_stream)):
                return handler
            return with_behavior(handler, self._wrap_async_gen(handler.stream_stream, parse=False), deserializer)
        behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary
        if inspect.isasyncgenfunction(behavior):
            wrapped = self._wrap_async_gen(behavior)
        elif inspect.iscoroutinefunction(behavior):
            wrapped = self._wrap_coroutine(behavior)
        else:
            return handler
        return with_behavior(handler, wrapped, deserializer)

    def _wrap_coroutine(self, behavior: _Behavior) -> _Behavior:
        """Wraps a coroutine handler: a unary one, or a streaming one that writes with context.write."""

        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if isinstance(request, UnparsedRequest):
                await _abort_unparsed(context, request)
            try:
                return await behavior(request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await abort_with(context, exc, self._field_paths, self._retry_delay_s)

        return wrapped

    def _wrap_async_gen(self, behavior: _Behavior, parse: bool = True) -> _Behavior:
        """Wraps an async-generator handler as a coroutine that writes each response with context.write, so that a
        cancelled call closes the handler at once, in its own task (see ServerTracingInterceptor._wrap_async_gen).
        `parse`: the request is one message, reported here if it does not parse (a request stream is the
        handler's to read)."""

        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            if parse and isinstance(request, UnparsedRequest):
                await _abort_unparsed(context, request)
            try:
                async with contextlib.aclosing(behavior(request, context)) as responses:
                    async for response in responses:
                        await context.write(response)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await abort_with(context, exc, self._field_paths, self._retry_delay_s)

        return wrapped


async def _abort_unparsed(context: grpc.aio.ServicerContext[Any, Any], request: UnparsedRequest) -> NoReturn:
    # NOTE: the error names a field path of the request message itself: no engine field name to map.
    await abort_with(context, request.error, field_paths={})


def _retry_info(retry_after_s: float | None) -> error_details_pb2.RetryInfo | None:
    """RetryInfo of a delay rounded to whole milliseconds (at least 1 ms); None for None."""
    if retry_after_s is None:
        return None
    delay = duration_pb2.Duration()
    delay.FromMilliseconds(max(round(retry_after_s * 1000), 1))
    return error_details_pb2.RetryInfo(retry_delay=delay)


def _rich(code: int, message: str, detail: Any) -> status_pb2.Status:
    status = status_pb2.Status(code=code, message=message)
    if detail is not None:
        status.details.add().Pack(detail)
    return status


def call_status(rpc_error: grpc.aio.AioRpcError) -> status_pb2.Status:
    """The google.rpc.Status a failed call ended with: its rich one (with details) when it sent one, else its code
    and details."""
    rich = _rich_status(rpc_error)
    if rich.code == rpc_error.code().value[0]:
        return rich
    return status_pb2.Status(code=rpc_error.code().value[0], message=rpc_error.details() or "")


def _passed_through(rpc_error: grpc.aio.AioRpcError) -> grpc.Status:
    return rpc_status.to_status(call_status(rpc_error))


def _details(error: grpc.aio.AioRpcError | grpc.Call | status_pb2.Status) -> Sequence[any_pb2.Any]:
    return (error if isinstance(error, status_pb2.Status) else _rich_status(error)).details


def _rich_status(rpc_error: grpc.aio.AioRpcError | grpc.Call) -> status_pb2.Status:
    """The google.rpc.Status in the error's trailing metadata; an empty one when it carries none."""
    for key, value in rpc_error.trailing_metadata() or ():
        if key == _STATUS_DETAILS_KEY and isinstance(value, bytes):
            return status_pb2.Status.FromString(value)
    return status_pb2.Status()
