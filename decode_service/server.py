"""The DecodeService gRPC servicer: protobuf in, DecodeWorker, protobuf out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc.aio

from common.errors import InvalidArgumentError, UnavailableError
from common.grpc_errors import abort_with
from common.proto_convert import duration_to_pb, finish_reason_to_pb, sampling_params_from_pb, stop_reason_to_pb
from decode_service.decode_worker import DecodeWorker
from engine.scheduler_output import EngineOutput
from kv_transfer.state import TransferError
from kv_transfer.target import KVTarget
from pdserve.v1 import decode_pb2, decode_pb2_grpc
from pod.convert import kv_target_to_pb

SERVICE_NAME = "pdserve.v1.DecodeService"

Context = grpc.aio.ServicerContext[Any, Any]


class DecodeServicer(decode_pb2_grpc.DecodeServiceServicer):
    """Thin servicer; `worker` is set once the engine has loaded (UNAVAILABLE before)."""

    def __init__(self) -> None:
        self.worker: DecodeWorker | None = None

    async def Reserve(self, request: decode_pb2.ReserveRequest, context: Context) -> decode_pb2.ReserveResponse:
        try:
            reservation = await self._worker().reserve(
                request.num_prompt_tokens, request.max_tokens, request.request_id
            )
        except InvalidArgumentError as exc:
            # NOTE: ReserveRequest's fields are top-level (max_tokens is no sampling_params field here).
            await abort_with(context, exc, field_paths={})
        return _reservation_to_pb(reservation)

    async def Decode(
        self, request: decode_pb2.DecodeRequest, context: Context
    ) -> AsyncIterator[decode_pb2.DecodeResponse]:
        worker = self._worker()
        params = sampling_params_from_pb(request.sampling_params, max_n=1)
        outputs = worker.decode(
            request.transfer_id, list(request.prompt_token_ids), request.first_token_id, params, request.request_id
        )
        try:
            async for output in outputs:
                yield _decode_response(output, params.logprobs)
        except TransferError as exc:
            raise exc.for_request(request.request_id) from exc

    async def Release(self, request: decode_pb2.ReleaseRequest, context: Context) -> decode_pb2.ReleaseResponse:
        self._worker().release(request.transfer_id)
        return decode_pb2.ReleaseResponse()

    def _worker(self) -> DecodeWorker:
        if self.worker is None:
            raise UnavailableError("decode pod is still loading")
        return self.worker


def _reservation_to_pb(target: KVTarget) -> decode_pb2.ReserveResponse:
    assert target.lease_s is not None  # NOTE: a decode pod always knows its own lease
    return decode_pb2.ReserveResponse(kv_target=kv_target_to_pb(target), lease=duration_to_pb(target.lease_s))


def _decode_response(output: EngineOutput, logprobs: bool) -> decode_pb2.DecodeResponse:
    return decode_pb2.DecodeResponse(
        token_ids=output.new_token_ids,
        logprobs=[lp for lp in output.new_logprobs if lp is not None] if logprobs else [],
        finish_reason=finish_reason_to_pb(output.finish_reason),
        stop_reason=stop_reason_to_pb(output.stop_reason),
    )
