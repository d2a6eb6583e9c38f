"""Plain values of one Prefill call: where its KV goes, and the two things it reports."""

from __future__ import annotations

from dataclasses import dataclass

from kv_transfer.layout import KVLayout


@dataclass(slots=True, frozen=True)
class KVTarget:
    """Blocks reserved on a decode pod for a request's prompt KV (DecodeService.Reserve's answer)."""

    transfer_id: str
    backend: str
    endpoint: str
    block_ids: tuple[int, ...]
    layout: KVLayout
    lease_s: float | None = None
    """How long the reservation holds without a chunk (None: unknown)."""


@dataclass(slots=True, frozen=True)
class FirstToken:
    """The first sampled token, reported as soon as the engine has it (before the transfer ends)."""

    token_id: int
    logprob: float | None
    num_cached_tokens: int
    prefill_duration_s: float
    finish_reason: str | None
    """"stop" or "length" when this token already ends the request; then no transfer follows."""
    stop_reason: int | None
    """The stop token id, when finish_reason is "stop"."""


@dataclass(slots=True, frozen=True)
class TransferDone:
    """The decode pod acknowledged the request's whole prompt KV."""

    num_blocks: int
    num_bytes: int
    duration_s: float


PrefillEvent = FirstToken | TransferDone
