"""The servicers raise and the ErrorInterceptor alone ends the call: a transfer error is reported with ONE abort,
even when that abort fails because the caller has already gone (a second abort would raise "Abort already
called!")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from common.grpc.errors import ErrorInterceptor
from kv_transfer.state import TransferAbortedError
from pdserve.v1 import kv_transfer_pb2, prefill_pb2, sampling_pb2
from pod.runtime import POD_FIELD_PATHS
from prefill_service.server import PrefillServicer

pytestmark = pytest.mark.anyio


class CallerGoneContext:
    """A servicer context whose call ended meanwhile: abort fails to send the status (as grpc's does, with an
    ExecuteBatchError), and a second abort raises like grpc's UsageError."""

    def __init__(self) -> None:
        self.aborts: list[tuple[grpc.StatusCode, str]] = []

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False

    async def write(self, message: object) -> None:
        pass

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        self.aborts.append((code, details))
        if len(self.aborts) > 1:
            raise RuntimeError("Abort already called!")
        raise ConnectionError("sending the status failed: the call is over")


class FailingFront:
    async def prefill(self, *args: object) -> AsyncIterator[object]:
        raise TransferAbortedError("KV transfer 't' ended aborted")
        yield


async def run_through_interceptor(behavior: Any, request: object, context: CallerGoneContext) -> None:
    """Run a server-streaming handler the way grpc.aio would, behind the pods' ErrorInterceptor (which serves it as a
    coroutine writing with context.write)."""

    async def continuation(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any]:
        return grpc.unary_stream_rpc_method_handler(behavior)

    handler = await ErrorInterceptor(POD_FIELD_PATHS).intercept_service(continuation, None)  # type: ignore[arg-type]
    assert handler is not None
    with pytest.raises(ConnectionError):
        await handler.unary_stream(request, context)


async def test_a_transfer_error_is_aborted_once() -> None:
    servicer = PrefillServicer()
    servicer.front = FailingFront()  # type: ignore[assignment]
    request = prefill_pb2.PrefillRequest(
        request_id="r1",
        prompt_token_ids=[1, 2],
        sampling_params=sampling_pb2.SamplingParams(max_tokens=4),
        kv_target=kv_transfer_pb2.KVTarget(
            transfer_id="t",
            backend=kv_transfer_pb2.TRANSFER_BACKEND_TCP,
            block_ids=[0],
            layout=kv_transfer_pb2.KVLayout(
                dtype="float32", block_size=16, num_layers=2, num_kv_heads=2, head_dim=32, block_nbytes=16384
            ),
        ),
    )
    context = CallerGoneContext()
    await run_through_interceptor(servicer.Prefill, request, context)
    assert context.aborts == [(grpc.StatusCode.ABORTED, "request 'r1': KV transfer 't' ended aborted")]
