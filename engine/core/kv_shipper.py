"""KVShipper: ships each prefill request's prompt KV to its decode pod's reserved blocks as the engine computes it.

Two threads call it, under one lock, so that the chunks of a transfer never interleave and the last one is last:
- the engine thread after every step (`ship_ready`): the request's newly computed full blocks, then, once the
  whole prompt is computed, the rest (the last, maybe partial, block) as the last chunk;
- the core's keepalive thread (`keep_alive`): an empty chunk for a request that has sent nothing for a third of its
  reservation's lease (queued behind other prefills, or inside one long engine step), which renews the decode
  pod's reservation (and this sender's lease, through its ack). A shipment is added with its request (`add`), so
  keepalives run while it waits in the engine's queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from common.errors import InvalidArgumentError
from engine.llm_engine import LLMEngine
from kv_transfer.base import KVSender
from kv_transfer.state import TransferError
from kv_transfer.target import KVTarget

logger = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class Shipment:
    """One request's transfer: where its blocks go, how many went out, and when the last chunk did."""

    target: KVTarget
    num_prompt_tokens: int
    keepalive_s: float
    last_sent_at: float
    num_sent_blocks: int = 0


class KVShipper:
    """The shipments of one prefill pod. `on_failed(transfer_id, error)` is called (under the lock: it must only hand
    the error on) when sending a chunk raises; the shipment is dropped and its transfer aborted then."""

    def __init__(self, sender: KVSender, block_size: int, on_failed: Callable[[str, TransferError], None]) -> None:
        self._sender = sender
        self._block_size = block_size
        self._on_failed = on_failed
        self._lock = threading.Lock()
        self._shipments: dict[str, Shipment] = {}

    def add(self, transfer_id: str, shipment: Shipment) -> None:
        """Engine thread, with the request: keepalives start now, blocks ship from the next step on."""
        with self._lock:
            self._shipments[transfer_id] = shipment

    def forget(self, transfer_id: str, endpoint: str | None) -> None:
        """Ship nothing more for the request; with `endpoint`, abort its transfer (a no-op if it already ended),
        telling the receiver there even if no chunk went out yet (its reservation would otherwise wait for its
        lease). None: the transfer already ended."""
        with self._lock:
            self._shipments.pop(transfer_id, None)
            if endpoint is not None:
                self._sender.abort(transfer_id, endpoint)

    def ship_ready(self, engine: LLMEngine) -> None:
        """Engine thread, after a step: ship every request's newly computed blocks; forget requests that are gone."""
        with self._lock:
            for transfer_id, shipment in list(self._shipments.items()):
                progress = engine.kv_progress(transfer_id)
                if progress is None:
                    del self._shipments[transfer_id]
                    continue
                block_ids, num_computed = progress
                done = num_computed >= shipment.num_prompt_tokens
                # NOTE: before `done`, num_computed // block_size < len(target.block_ids): the last chunk is never
                # empty.
                num_ready = len(shipment.target.block_ids) if done else num_computed // self._block_size
                if num_ready > shipment.num_sent_blocks:
                    self._send(transfer_id, shipment, block_ids, num_ready, last=done)

    def keep_alive(self) -> None:
        """Send an empty chunk for every request that has sent nothing for its keepalive period."""
        now = time.monotonic()
        with self._lock:
            for transfer_id, shipment in list(self._shipments.items()):
                if now - shipment.last_sent_at >= shipment.keepalive_s:
                    self._send(transfer_id, shipment, [], shipment.num_sent_blocks, last=False)

    def _send(self, transfer_id: str, shipment: Shipment, block_ids: list[int], num_ready: int, last: bool) -> None:
        """Send blocks [num_sent_blocks, num_ready) of the request (none: a keepalive); the lock is held."""
        start, target = shipment.num_sent_blocks, shipment.target
        try:
            self._sender.send(
                transfer_id,
                target.endpoint,
                target.layout,
                block_ids[start:num_ready],
                target.block_ids[start:num_ready],
                last,
            )
        except Exception as exc:  # one bad transfer must not stop the engine thread or the keepalives
            if isinstance(exc, InvalidArgumentError):
                # NOTE: a KV target the caller made up (e.g. an endpoint that is no host:port): bad input, no bug.
                logger.warning("shipping the KV of %s failed: %s", transfer_id, exc)
            else:
                logger.exception("shipping the KV of %s failed", transfer_id)
            del self._shipments[transfer_id]
            self._sender.abort(transfer_id, target.endpoint)
            self._on_failed(
                transfer_id, exc if isinstance(exc, TransferError) else TransferError(f"shipping KV: {exc}")
            )
            return
        shipment.num_sent_blocks = num_ready
        shipment.last_sent_at = time.monotonic()
        if last:
            del self._shipments[transfer_id]
