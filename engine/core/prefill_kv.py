"""PrefillKV: a prefill pod's engine core side of KV transfer, over the pod's KV sender.

Lifecycle of one request (`AddRequest` with a KV target; its engine request id is the transfer id):
1. The request is queued with its blocks held past its end, and its shipment starts: keepalives (an empty chunk when
   the transfer has been silent for `keepalive_s`, from the core's keepalive thread) renew the decode pod's
   reservation while the request waits, and after every step the shipper sends its newly computed blocks
   (`engine.core.kv_shipper`). Bad input fails the request (`RequestFailed`) and aborts its transfer, so the decode pod
   frees its reservation at once.
2. After every step the core reports the prefix cache's events and how far each prompt is computed.
3. The transfer ends: the sender's `on_finished` hook (or a failed send) notifies the core, which frees the held
   blocks on its own thread (released after DONE: the request may still be finishing under async scheduling;
   aborted otherwise) and reports `TransferEnded` once per transfer, with the sender's stats.
`AbortRequest` (the call was cancelled, or the first token ended the request and no decode follows) aborts the
request and its transfer, telling the decode pod even if no chunk went out yet.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from common.errors import InvalidArgumentError
from engine.core.commands import AddRequest
from engine.core.kv_shipper import KVShipper, Shipment
from engine.core.outputs import CoreOutputs, ErrorInfo, PrefillProgress, RequestFailed, TransferEnded
from engine.llm_engine import LLMEngine
from kv_transfer.base import KVSender, TransferStats
from kv_transfer.state import TransferError, TransferState, UnknownTransferError
from kv_transfer.target import KVTarget

KEEPALIVE_TICK_S = 0.02


@dataclass(slots=True, frozen=True)
class TransferFinished:
    """The sender's notice that a transfer ended (`error`: a failed send's, else the sender's own)."""

    req_id: str
    state: TransferState
    error: TransferError | None = None


@dataclass(slots=True)
class _Tracked:
    num_prompt_tokens: int
    num_computed_tokens: int = -1


class PrefillKV:
    """Shipments of one prefill engine; `notify(notice)` hands a sender hook's notice to the core's thread."""

    def __init__(self, engine: LLMEngine, sender: KVSender, notify: Callable[[object], None]) -> None:
        self._engine = engine
        self.sender = sender
        sender.on_finished = lambda req_id, state: notify(TransferFinished(req_id, state))
        self._shipper = KVShipper(
            sender,
            engine.info.block_size,
            on_failed=lambda req_id, error: notify(TransferFinished(req_id, TransferState.FAILED, error)),
        )
        self._targets: dict[str, KVTarget] = {}
        """Transfers not ended yet, by request id."""
        self._tracked: dict[str, _Tracked] = {}
        """Requests whose prompt is not computed yet."""
        self._stopped = threading.Event()
        self._keepalive = threading.Thread(target=self._keep_alive, name="kv-keepalive", daemon=True)
        self._keepalive.start()

    @property
    def waiting(self) -> bool:
        return False

    def add(self, command: AddRequest, out: CoreOutputs) -> None:
        req_id, target = command.req_id, command.kv_target
        assert target is not None
        if req_id in self._targets or self._sender_knows(req_id):
            # NOTE: no abort: the id names another request's transfer.
            error = InvalidArgumentError("kv_target.transfer_id", f"{req_id!r} is empty or already used")
            out.failures.append(RequestFailed(req_id, ErrorInfo.of(error)))
            return
        try:
            self._engine.add_request(
                req_id,
                command.prompt_token_ids,
                command.params,
                hold_kv=True,
                cache_salt=command.cache_salt,
                images=command.images,
            )
        except InvalidArgumentError as exc:
            self.sender.abort(req_id, target.endpoint)
            out.failures.append(RequestFailed(req_id, ErrorInfo.of(exc)))
            return
        self._targets[req_id] = target
        self._tracked[req_id] = _Tracked(len(command.prompt_token_ids))
        shipment = Shipment(target, len(command.prompt_token_ids), command.keepalive_s, last_sent_at=time.monotonic())
        self._shipper.add(req_id, shipment)

    def abort(self, req_id: str) -> None:
        target = self._targets.get(req_id)
        self._shipper.forget(req_id, None if target is None else target.endpoint)
        self._tracked.pop(req_id, None)

    def poll(self, out: CoreOutputs) -> None:
        """Nothing waits on the prefill side."""

    def after_step(self, out: CoreOutputs) -> None:
        """Ship newly computed blocks; report cache events and each prompt's progress."""
        engine = self._engine
        out.cache_events.extend(engine.kv_cache_manager.take_events())
        self._shipper.ship_ready(engine)
        for req_id, tracked in list(self._tracked.items()):
            progress = engine.kv_progress(req_id)
            if progress is None:
                del self._tracked[req_id]
                continue
            num_computed = progress[1]
            if num_computed != tracked.num_computed_tokens:
                request = engine.scheduler.requests.get(req_id)
                num_cached = (request.num_cached_tokens or 0) if request is not None else 0
                out.prefill_progress.append(PrefillProgress(req_id, num_computed, num_cached))
                tracked.num_computed_tokens = num_computed
            if num_computed >= tracked.num_prompt_tokens:
                del self._tracked[req_id]

    def on_notice(self, notice: object, out: CoreOutputs) -> None:
        if not isinstance(notice, TransferFinished) or self._targets.pop(notice.req_id, None) is None:
            return  # NOTE: a transfer ends once; a failed send's abort fires the hook a second time
        req_id, state = notice.req_id, notice.state
        stats = self._stats(req_id)
        summary = dataclasses.replace(stats, error=None)
        if state is TransferState.DONE:
            # NOTE: released, not aborted: under async scheduling the last chunk can be acked while the first token
            # is still in flight; the request finishes with it, then its blocks are freed.
            self._engine.release_kv(req_id)
            out.transfers_ended.append(TransferEnded(req_id, state, summary))
            return
        error = notice.error or stats.error or TransferError(f"KV transfer {req_id!r} ended {state.value}")
        # NOTE: abort_requests releases the held blocks of a finished request and aborts a running one.
        self._engine.abort_requests([req_id])
        self._tracked.pop(req_id, None)
        out.transfers_ended.append(TransferEnded(req_id, state, summary, ErrorInfo.of(error)))

    def close(self) -> None:
        """Stop the keepalives; live transfers end ABORTED (their hooks run before this returns)."""
        self._stopped.set()
        self._keepalive.join(timeout=1.0)
        self.sender.close()

    def _sender_knows(self, req_id: str) -> bool:
        try:
            self.sender.state(req_id)
        except UnknownTransferError:
            return False
        return True

    def _stats(self, req_id: str) -> TransferStats:
        try:
            return self.sender.stats(req_id)
        except TransferError:  # NOTE: a transfer that failed before its first chunk went out
            return TransferStats(req_id, TransferState.FAILED, 0, 0, 0, 0.0)

    def _keep_alive(self) -> None:
        while not self._stopped.wait(KEEPALIVE_TICK_S):
            self._shipper.keep_alive()
