"""Abort by request id across the router's processes: whichever process the Abort call reaches, the request ends.

With `--workers N` the kernel hands each client connection to one process, so an Abort may reach a process other
than the one running the request (or a request id may run in several, ids being the caller's). So:
1. the process the Abort call reached cancels its own requests of that id (RunningRequests.abort);
2. unless the call was itself forwarded (FORWARDED_KEY in its metadata), it sends the same Abort to every sibling at
   once, over their private Unix sockets (router.processes.router_process), marked forwarded and carrying the caller's
   `authorization` (the siblings check tokens as the public port does); a forwarded call is answered from the
   sibling's own requests only, so nothing is forwarded twice;
3. the answers merge (running_requests.merge_aborts); a sibling that fails or does not answer within `timeout_s`
   (restarting, say) counts as NOT_FOUND, and is logged.
The channels reconnect within a second of a sibling's restart (short reconnect backoff).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence

import grpc.aio

from common.grpc.server import reconnect_options
from pdserve.v1 import generation_pb2, generation_pb2_grpc
from router.completion.running_requests import AbortResult

logger = logging.getLogger(__name__)

FORWARDED_KEY = "x-pdserve-abort-forwarded"
"""Metadata of an Abort one router process forwards to another: answer from your own requests only."""
AUTHORIZATION_KEY = "authorization"
ABORT_TIMEOUT_S = 0.5

_ABORT_RESULTS = {
    generation_pb2.ABORT_RESULT_ABORTED: AbortResult.ABORTED,
    generation_pb2.ABORT_RESULT_ALREADY_FINISHED: AbortResult.ALREADY_FINISHED,
    generation_pb2.ABORT_RESULT_NOT_FOUND: AbortResult.NOT_FOUND,
}
_CHANNEL_OPTIONS = reconnect_options(max_backoff_s=1.0)
"""A restarted sibling must be reachable again at once."""

Metadata = Iterable[tuple[str, str | bytes]]


def is_forwarded(metadata: Metadata) -> bool:
    """Whether an Abort call came from a sibling process."""
    return any(key == FORWARDED_KEY for key, _ in metadata)


class SiblingAborts:
    """Abort calls to the router's other processes at `addresses` (their `unix:` sockets)."""

    def __init__(self, addresses: Sequence[str], timeout_s: float = ABORT_TIMEOUT_S) -> None:
        self._channels = [grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS) for address in addresses]
        self._stubs = [generation_pb2_grpc.GenerationServiceStub(channel) for channel in self._channels]
        self._addresses = list(addresses)
        self._timeout_s = timeout_s

    async def abort(self, request_id: str, metadata: Metadata) -> list[tuple[AbortResult, int]]:
        """Each sibling's answer to Abort(`request_id`), forwarded with the caller's authorization from `metadata`."""
        forwarded = [(FORWARDED_KEY, "1")]
        forwarded += [(key, value) for key, value in metadata if key == AUTHORIZATION_KEY and isinstance(value, str)]
        request = generation_pb2.AbortRequest(request_id=request_id)
        replies = await asyncio.gather(
            *(stub.Abort(request, metadata=forwarded, timeout=self._timeout_s) for stub in self._stubs),
            return_exceptions=True,
        )
        answers = []
        for address, reply in zip(self._addresses, replies, strict=True):
            if isinstance(reply, generation_pb2.AbortResponse):
                answers.append((_ABORT_RESULTS.get(reply.result, AbortResult.NOT_FOUND), reply.num_aborted))
            else:
                logger.warning("abort of %r not forwarded to %s: %r", request_id, address, reply)
                answers.append((AbortResult.NOT_FOUND, 0))
        return answers

    async def aclose(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self._channels))
