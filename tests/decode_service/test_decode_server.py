"""DecodeService reports a transfer error with ONE abort, the ErrorInterceptor's (see
tests/prefill_service/test_prefill_server.py for the context that fails like a call whose caller has gone)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from decode_service.server import DecodeServicer
from kv_transfer.state import TransferExpiredError
from pdserve.v1 import decode_pb2, sampling_pb2
from tests.prefill_service.test_prefill_server import CallerGoneContext, run_through_interceptor

pytestmark = pytest.mark.anyio


class FailingWorker:
    async def decode(self, *args: object) -> AsyncIterator[object]:
        raise TransferExpiredError("KV transfer 't' ended expired before all blocks arrived")
        yield


async def test_a_transfer_error_is_aborted_once() -> None:
    servicer = DecodeServicer()
    servicer.worker = FailingWorker()  # type: ignore[assignment]
    request = decode_pb2.DecodeRequest(
        request_id="r2",
        transfer_id="t",
        prompt_token_ids=[1, 2],
        first_token_id=3,
        sampling_params=sampling_pb2.SamplingParams(max_tokens=4),
    )
    context = CallerGoneContext()
    await run_through_interceptor(servicer.Decode, request, context)
    assert context.aborts == [
        (grpc.StatusCode.ABORTED, "request 'r2': KV transfer 't' ended expired before all blocks arrived")
    ]
