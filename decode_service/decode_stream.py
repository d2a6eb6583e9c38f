"""One router's DecodeStream on a decode pod: its open requests by key, and what is waiting to be written to it.

The pod's front appends each engine step's tokens and ends of the stream's requests to its `StreamBatch` (`add`,
`end`) and wakes the writer once per step; the servicer's writer takes whatever accumulated (`next_batch`) and writes
it as one message. A router that reads slower than the engine steps gets several steps in one message, never a
backlog of messages. Plain values only: the servicer converts them to protobuf.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from common.errors import PdserveError
from common.proto_convert import FinishReason
from common.sampling_params import SamplingParams
from engine.scheduler_output import FinishedBeam


@dataclass(slots=True, frozen=True)
class DecodeStart:
    """A DecodeStart frame: decode `transfer_id`'s request under `key` on this stream."""

    key: int
    request_id: str
    transfer_id: str
    prompt_token_ids: list[int]
    first_token_id: int
    params: SamplingParams
    trace_context: Mapping[str, str] = field(default_factory=dict)
    """The request's W3C trace context (its spans on this pod continue that trace)."""


@dataclass(slots=True, frozen=True)
class StreamEnd:
    """A request's end: its finish reason, or the error that failed it."""

    key: int
    finish_reason: FinishReason | None = None
    stop_reason: int | None = None
    error: PdserveError | None = None
    beams: tuple[FinishedBeam, ...] = ()
    """A beam search request's returned beams, best first."""


@dataclass(slots=True)
class StreamBatch:
    """Tokens and ends to write in one message (the columns of DecodeStreamResponse)."""

    keys: list[int] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    num_logprobs: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ends: list[StreamEnd] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.keys or self.ends)


class DecodeStreamSession:
    """One DecodeStream's state on the pod; see the module docstring."""

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.transfer_ids: dict[int, str] = {}
        """The stream's open requests: key -> transfer id."""
        self._batch = StreamBatch()
        self._ready = asyncio.Event()
        self._closed = False
        self._error: PdserveError | None = None

    def add(self, key: int, token_ids: list[int], logprobs: list[float] | None) -> None:
        batch = self._batch
        batch.keys.append(key)
        batch.num_tokens.append(len(token_ids))
        batch.token_ids.extend(token_ids)
        if logprobs is None:
            batch.num_logprobs.append(0)
        else:
            batch.num_logprobs.append(len(logprobs))
            batch.logprobs.extend(logprobs)

    def end(self, end: StreamEnd) -> None:
        self.transfer_ids.pop(end.key, None)
        self._batch.ends.append(end)

    def flush(self) -> None:
        """Wake the writer if anything is waiting (once per engine step)."""
        if self._batch:
            self._ready.set()

    def close(self, error: PdserveError | None = None) -> None:
        """The stream ended (with `error`: the router sent something that is no frame): the writer stops."""
        self._closed = True
        self._error = self._error or error
        self._ready.set()

    async def next_batch(self) -> StreamBatch | None:
        """Everything accumulated since the last call, once there is something; None once the stream closed (its
        error raised, if it closed with one)."""
        while not self._batch:
            if self._closed:
                if self._error is not None:
                    raise self._error
                return None
            await self._ready.wait()
            self._ready.clear()
        batch, self._batch = self._batch, StreamBatch()
        self._ready.clear()
        return batch
