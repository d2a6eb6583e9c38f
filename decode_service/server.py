"""The DecodeService gRPC servicer: protobuf in, DecodeFront, protobuf out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc.aio

from common.errors import InvalidArgumentError, UnavailableError
from common.grpc.errors import abort_with, rich_status
from common.grpc.request_parsing import UnparsedRequest
from common.proto_convert import duration_to_pb, finish_reason_to_pb, sampling_params_from_pb, stop_reason_to_pb
from decode_service.decode_front import DecodeFront
from decode_service.decode_stream import DecodeStart, DecodeStreamSession, StreamBatch, StreamEnd
from engine.scheduler_output import FinishedBeam
from kv_transfer.target import KVTarget
from pdserve.v1 import decode_pb2, decode_pb2_grpc
from pod.convert import kv_target_to_pb
from pod.runtime import POD_FIELD_PATHS

SERVICE_NAME = "pdserve.v1.DecodeService"

Context = grpc.aio.ServicerContext[Any, Any]


class DecodeServicer(decode_pb2_grpc.DecodeServiceServicer):
    """Thin servicer; `front` is set once the engine has loaded (UNAVAILABLE before)."""

    def __init__(self) -> None:
        self.front: DecodeFront | None = None

    async def Reserve(self, request: decode_pb2.ReserveRequest, context: Context) -> decode_pb2.ReserveResponse:
        try:
            reservation = await self._front().reserve(request.num_prompt_tokens, request.max_tokens, request.request_id)
        except InvalidArgumentError as exc:
            # NOTE: ReserveRequest's fields are top-level (max_tokens is no sampling_params field here).
            await abort_with(context, exc, field_paths={})
        return _reservation_to_pb(reservation)

    async def DecodeStream(
        self, request_iterator: AsyncIterator[decode_pb2.DecodeStreamRequest], context: Context
    ) -> AsyncIterator[decode_pb2.DecodeStreamResponse]:
        front = self._front()
        session = DecodeStreamSession(context.peer())
        reader = asyncio.create_task(_read_frames(front, session, request_iterator), name="decode-stream-reader")
        try:
            while (batch := await session.next_batch()) is not None:
                yield _response(batch)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            front.close_session(session)

    async def Release(self, request: decode_pb2.ReleaseRequest, context: Context) -> decode_pb2.ReleaseResponse:
        self._front().release(request.transfer_id)
        return decode_pb2.ReleaseResponse()

    def _front(self) -> DecodeFront:
        if self.front is None:
            raise UnavailableError("decode pod is still loading")
        return self.front


async def _read_frames(
    front: DecodeFront, session: DecodeStreamSession, frames: AsyncIterator[decode_pb2.DecodeStreamRequest]
) -> None:
    """The router's frames until it closes its side; then the session closes (its open requests end). A frame that
    does not parse closes it with that error (INVALID_ARGUMENT naming the field)."""
    try:
        async for frame in frames:
            if isinstance(frame, UnparsedRequest):
                session.close(frame.error)
                return
            if frame.HasField("start"):
                _start(front, session, frame.start)
            elif frame.HasField("cancel"):
                front.cancel(session, frame.cancel.key)
    finally:
        front.close_session(session)


def _start(front: DecodeFront, session: DecodeStreamSession, start: decode_pb2.DecodeStart) -> None:
    try:
        params = sampling_params_from_pb(start.sampling_params, max_n=1)
    except InvalidArgumentError as exc:
        session.end(StreamEnd(start.key, error=exc))
        session.flush()
        return
    front.start(
        session,
        DecodeStart(
            start.key,
            start.request_id,
            start.transfer_id,
            list(start.prompt_token_ids),
            start.first_token_id,
            params,
            dict(start.trace_context),
        ),
    )


def _reservation_to_pb(target: KVTarget) -> decode_pb2.ReserveResponse:
    assert target.lease_s is not None  # NOTE: a decode pod always knows its own lease
    return decode_pb2.ReserveResponse(kv_target=kv_target_to_pb(target), lease=duration_to_pb(target.lease_s))


def _response(batch: StreamBatch) -> decode_pb2.DecodeStreamResponse:
    return decode_pb2.DecodeStreamResponse(
        keys=batch.keys,
        num_tokens=batch.num_tokens,
        token_ids=batch.token_ids,
        num_logprobs=batch.num_logprobs,
        logprobs=batch.logprobs,
        ends=[_end(end) for end in batch.ends],
    )


def _end(end: StreamEnd) -> decode_pb2.DecodeEnd:
    if end.error is not None:
        return decode_pb2.DecodeEnd(key=end.key, error=rich_status(end.error, POD_FIELD_PATHS))
    return decode_pb2.DecodeEnd(
        key=end.key,
        finish_reason=finish_reason_to_pb(end.finish_reason),
        stop_reason=stop_reason_to_pb(end.stop_reason),
        beams=[beam_to_pb(beam) for beam in end.beams],
    )


def beam_to_pb(finished: FinishedBeam) -> decode_pb2.Beam:
    beam = finished.beam
    return decode_pb2.Beam(
        token_ids=beam.token_ids,
        logprobs=beam.logprobs,
        cumulative_logprob=beam.cumulative_logprob,
        finish_reason=finish_reason_to_pb(finished.finish_reason),
        stop_reason=stop_reason_to_pb(finished.stop_reason),
    )
