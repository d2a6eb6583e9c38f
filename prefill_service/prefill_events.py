"""Plain values of one Prefill call: the two things it reports (its KV goes to a `kv_transfer.KVTarget`)."""

from __future__ import annotations

from dataclasses import dataclass


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
