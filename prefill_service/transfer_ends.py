"""The open Prefill calls of a prefill pod, each waiting for its KV transfer's end, and how a transfer ends.

1. A call opens its entry on the event loop (`open`).
2. The transfer ends: the sender's housekeeping thread calls `on_transfer_finished` (or the shipper
   `on_ship_failed`); the end is counted and logged, the request's held blocks are freed on the engine thread
   (released after DONE, aborted otherwise), and the call's wait resolves (None after DONE, the TransferError
   otherwise).
3. The call closes its entry when it ends, however it ends (`close`); a later end is only counted and logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from common.metrics import ServiceMetrics
from engine.async_engine import AsyncEngine
from kv_transfer.base import KVSender
from kv_transfer.state import TransferError, TransferState

logger = logging.getLogger(__name__)

TransferEnd = asyncio.Future[TransferError | None]


class TransferEnds:
    """transfer_id -> the future its Prefill call awaits, and the router's request id (for logs)."""

    def __init__(self, sender: KVSender, backend: str, metrics: ServiceMetrics, async_engine: AsyncEngine) -> None:
        self._sender = sender
        self._backend = backend
        self._metrics = metrics
        self._async_engine = async_engine
        self._ends: dict[str, TransferEnd] = {}
        self._request_ids: dict[str, str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Bind to the running event loop (the futures live on it)."""
        self._loop = asyncio.get_running_loop()

    def __len__(self) -> int:
        return len(self._ends)

    def __contains__(self, transfer_id: object) -> bool:
        return transfer_id in self._ends

    def open(self, transfer_id: str, request_id: str) -> TransferEnd:
        """Event loop: the future that the transfer's end resolves."""
        assert self._loop is not None, "start() first"
        ended: TransferEnd = self._loop.create_future()
        self._ends[transfer_id] = ended
        self._request_ids[transfer_id] = request_id
        return ended

    def close(self, transfer_id: str) -> None:
        """Event loop: the call ended; a later resolve is a no-op."""
        del self._ends[transfer_id]
        del self._request_ids[transfer_id]

    def request_id(self, transfer_id: str) -> str | None:
        """The router's request id of an open call; None once it closed."""
        return self._request_ids.get(transfer_id)

    def resolve_threadsafe(self, transfer_id: str, error: TransferError | None) -> None:
        """Any thread: end the call's wait (a no-op for a closed call, or one already resolved)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._resolve, transfer_id, error)

    def on_transfer_finished(self, transfer_id: str, state: TransferState) -> None:
        """Sender housekeeping thread: the transfer ended; count and log it, free the held blocks, end the call."""
        if state is TransferState.DONE:
            stats = self._sender.stats(transfer_id)
            self._metrics.observe_kv_transfer(self._backend, stats.num_bytes, stats.duration_s)
            # NOTE: released, not aborted: under async scheduling the last chunk can be acked while the first token
            # is still in flight; the request finishes with it, then its blocks are freed.
            self._end_transfer(transfer_id, None, self._async_engine.release_kv)
            return
        error = self._transfer_error(transfer_id, state)
        if state is TransferState.EXPIRED:
            self._metrics.count_kv_lease_expiry()
        elif state is TransferState.FAILED:
            self._metrics.count_kv_transfer_failure(self._backend)
        request_id = self.request_id(transfer_id)
        # NOTE: a transfer aborted after its call ended is this pod's own doing (a cancel, or no decode follows).
        log = logger.warning if request_id is not None else logger.debug
        log("KV transfer %s of request %r ended %s: %s", transfer_id, request_id, state.value, error)
        self._end_transfer(transfer_id, error)

    def on_ship_failed(self, transfer_id: str, error: TransferError) -> None:
        """Engine or keepalive thread (the shipper's lock held): sending a chunk failed."""
        self._metrics.count_kv_transfer_failure(self._backend)
        logger.warning(
            "KV transfer %s of request %r failed: %s",
            transfer_id,
            self.request_id(transfer_id) or "",
            error,
        )
        self._end_transfer(transfer_id, error)

    def _end_transfer(
        self, transfer_id: str, error: TransferError | None, free: Callable[[str], None] | None = None
    ) -> None:
        """Any thread: end the call's wait and free the request's blocks with `free` (default: abort).

        NOTE: abort_requests releases the held blocks of a finished request, and aborts a running one (its stream
        then ends with finish_reason "abort"), so one command covers every moment a failed transfer can end.
        """
        self.resolve_threadsafe(transfer_id, error)
        (free or self._async_engine.abort)(transfer_id)

    def _transfer_error(self, transfer_id: str, state: TransferState) -> TransferError:
        error = self._sender.stats(transfer_id).error
        return error or TransferError(f"KV transfer {transfer_id!r} ended {state.value}")

    def _resolve(self, transfer_id: str, error: TransferError | None) -> None:
        ended = self._ends.get(transfer_id)
        if ended is not None and not ended.done():
            ended.set_result(error)
