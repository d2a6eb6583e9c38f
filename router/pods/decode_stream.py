"""This router's DecodeStream to one decode pod, and the collectors that demultiplex it per request.

1. The first request decoded on the pod opens the stream (`DecodeMux.start`); every later one shares it. Each request
   gets a key and a `DecodeCollector`, and its DecodeStart goes out on the stream with the request's trace context
   (the shared stream's call carries none).
2. The stream's reader takes each message (one per engine step of the pod, or several steps merged) and hands every
   entry's tokens and every end to its request's collector.
3. A collector merges what arrives until its consumer takes it (`next_step`): a consumer slower than the engine gets
   several steps' tokens at once, never a backlog; one that keeps up gets each step as it arrives.
4. A request ends with its end (a finish reason, or its own error, classified by `router.pods.pod_errors`), or early
   with `cancel` (a DecodeCancel goes out). The stream failing (the pod died, the connection broke, the pod ended
   it) fails every collector on it at once, each with the same error, and the next request opens a new stream.
Protobuf stays here and in the reader: collectors and their consumers see plain values (`router.outputs.DecodeStep`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc.aio

from common.errors import UnavailableError
from common.proto_convert import finish_reason_from_pb, sampling_params_to_pb, stop_reason_from_pb
from common.telemetry import context_carrier
from pdserve.v1 import decode_pb2, decode_pb2_grpc
from router.outputs import BeamResult, DecodeRequest, DecodeStep
from router.pods.pod_errors import pod_error, rpc_error

logger = logging.getLogger(__name__)


class DecodeCollector:
    """One request's share of a DecodeStream; see the module docstring."""

    def __init__(self, key: int) -> None:
        self.key = key
        self._token_ids: list[int] = []
        self._logprobs: list[float] = []
        self._end: DecodeStep | None = None
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.done = False
        """The request ended (a finish reason, an error) or was cancelled; nothing more arrives."""

    def add(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> None:
        self._token_ids.extend(token_ids)
        self._logprobs.extend(logprobs)
        self._wake()

    def finish(self, end: DecodeStep) -> None:
        self._end = end
        self.done = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        if self.done:
            return
        self._error = error
        self.done = True
        self._wake()

    async def next_step(self) -> DecodeStep:
        """Every token that arrived since the last call (at least one, or the end), merged into one step."""
        while not (self._token_ids or self._end is not None or self._error is not None):
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._token_ids or self._end is not None:
            token_ids, self._token_ids = self._token_ids, []
            logprobs, self._logprobs = self._logprobs, []
            end, self._end = self._end, None
            if end is None:
                return DecodeStep(tuple(token_ids), tuple(logprobs))
            return DecodeStep(tuple(token_ids), tuple(logprobs), end.finish_reason, end.stop_reason, end.beams)
        assert self._error is not None
        raise self._error

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class DecodeMux:
    """This router's DecodeStream to one decode pod; see the module docstring."""

    def __init__(self, pod_id: str, stub: decode_pb2_grpc.DecodeServiceAsyncStub) -> None:
        self.pod_id = pod_id
        self._stub = stub
        self._keys = itertools.count(1)
        self._collectors: dict[int, DecodeCollector] = {}
        self._outbox: asyncio.Queue[decode_pb2.DecodeStreamRequest | None] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None
        self.closed = False
        """The stream failed or was closed: a new request needs a new mux."""

    def start(self, request: DecodeRequest) -> DecodeCollector:
        """Decode a request on this stream (opening it first if this is its first request)."""
        if self._reader is None:
            call = self._stub.DecodeStream(self._frames())
            self._reader = asyncio.create_task(self._read(call), name=f"decode-stream-{self.pod_id}")
        key = next(self._keys)
        collector = self._collectors[key] = DecodeCollector(key)
        start = decode_pb2.DecodeStart(
            key=key,
            request_id=request.request_id,
            transfer_id=request.transfer_id,
            prompt_token_ids=request.prompt_token_ids,
            first_token_id=request.first_token_id,
            sampling_params=sampling_params_to_pb(request.params),
            cache_salt=request.cache_salt,
            trace_context=context_carrier(),
        )
        self._outbox.put_nowait(decode_pb2.DecodeStreamRequest(start=start))
        return collector

    def cancel(self, collector: DecodeCollector) -> None:
        """End a request early (the pod frees its blocks); a no-op once it ended."""
        if self._collectors.pop(collector.key, None) is None:
            return
        collector.done = True
        if not self.closed:
            cancel = decode_pb2.DecodeCancel(key=collector.key)
            self._outbox.put_nowait(decode_pb2.DecodeStreamRequest(cancel=cancel))

    async def aclose(self) -> None:
        """End the stream (its open requests end on the pod) and wait for the reader."""
        self.closed = True
        self._outbox.put_nowait(None)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _frames(self) -> AsyncIterator[decode_pb2.DecodeStreamRequest]:
        while (frame := await self._outbox.get()) is not None:
            yield frame

    async def _read(self, call: grpc.aio.StreamStreamCall[Any, Any]) -> None:
        error: BaseException = UnavailableError(f"the DecodeStream to decode pod {self.pod_id} was closed")
        try:
            async for response in call:
                self._dispatch(response)
            error = UnavailableError(f"decode pod {self.pod_id} ended its DecodeStream")
        except grpc.aio.AioRpcError as exc:
            error = rpc_error(self.pod_id, "DecodeStream", exc)
        finally:
            self.closed = True
            call.cancel()
            collectors, self._collectors = self._collectors, {}
            if collectors:
                num_open = len(collectors)
                logger.warning("DecodeStream to %s ended with %d requests open: %s", self.pod_id, num_open, error)
            for collector in collectors.values():
                collector.fail(error)

    def _dispatch(self, response: decode_pb2.DecodeStreamResponse) -> None:
        collectors = self._collectors
        token_ids, logprobs = response.token_ids, response.logprobs
        start = logprob_start = 0
        for key, num_tokens, num_logprobs in zip(
            response.keys, response.num_tokens, response.num_logprobs, strict=True
        ):
            end, logprob_end = start + num_tokens, logprob_start + num_logprobs
            collector = collectors.get(key)
            if collector is not None:
                collector.add(token_ids[start:end], logprobs[logprob_start:logprob_end])
            start, logprob_start = end, logprob_end
        for ended in response.ends:
            collector = collectors.pop(ended.key, None)
            if collector is None:
                continue
            if ended.HasField("error"):
                collector.fail(pod_error(self.pod_id, "Decode", ended.error))
            else:
                reason = finish_reason_from_pb(ended.finish_reason)
                beams = tuple(_beam_from_pb(beam) for beam in ended.beams)
                collector.finish(DecodeStep((), (), reason, stop_reason_from_pb(ended.stop_reason), beams))


def _beam_from_pb(beam: decode_pb2.Beam) -> BeamResult:
    return BeamResult(
        tuple(beam.token_ids),
        tuple(beam.logprobs),
        beam.cumulative_logprob,
        finish_reason_from_pb(beam.finish_reason),
        stop_reason_from_pb(beam.stop_reason),
    )
