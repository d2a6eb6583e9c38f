"""Plain values the router's core exchanges: what it asks pods, what they answer and what a Generate stream carries.

Protobuf conversion happens at the edges (`router.pods.pod_client` for the pods, `router.server` for
clients); everything between sees these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.proto_convert import FinishReason, StopReason
from common.sampling_params import SamplingParams


@dataclass(slots=True, frozen=True)
class FirstToken:
    """A prefill pod's first message: the first sampled token."""

    token_id: int
    logprob: float | None
    num_cached_tokens: int
    finish_reason: FinishReason | None = None
    """Set when this token already ends the completion (then no decode happens)."""
    stop_reason: StopReason = None


@dataclass(slots=True, frozen=True)
class TransferDone:
    """A prefill pod's last message: the decode pod holds the prompt's whole KV."""

    num_blocks: int
    num_bytes: int
    duration_s: float


@dataclass(slots=True, frozen=True)
class DecodeRequest:
    """What a decode pod needs to decode a request from its second token on, once its prompt's KV is on the way."""

    request_id: str
    transfer_id: str
    """The decode pod's reservation that the prompt's KV goes to."""
    prompt_token_ids: Sequence[int]
    first_token_id: int
    params: SamplingParams
    cache_salt: str | None


@dataclass(slots=True, frozen=True)
class BeamResult:
    """One returned beam of a beam search request, as its decode pod reports it."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    cumulative_logprob: float
    finish_reason: FinishReason | None
    stop_reason: StopReason = None


@dataclass(slots=True, frozen=True)
class DecodeStep:
    """One message of a decode pod's stream."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason | None = None
    stop_reason: StopReason = None
    beams: tuple[BeamResult, ...] = ()
    """With the finish reason of a beam search request: its returned beams, best first."""


@dataclass(slots=True, frozen=True)
class CompletionMetrics:
    """How one completion was served, measured by the router."""

    prefill_pod_id: str
    decode_pod_id: str
    num_attempts: int
    time_to_first_token_s: float
    time_to_first_decode_token_s: float | None = None
    """None when no decode happened."""
    kv_transfer_bytes: int = 0
    kv_transfer_duration_s: float = 0.0


@dataclass(slots=True, frozen=True)
class Usage:
    """Token counts of a whole request (all its completions)."""

    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int


@dataclass(slots=True, frozen=True)
class CompletionChunk:
    """One message of a Generate stream: new tokens of completion `index`."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] = ()
    finish_reason: FinishReason | None = None
    stop_reason: StopReason = None
    metrics: CompletionMetrics | None = None
    """Set on the completion's last chunk."""
    num_cached_tokens: int = 0
    cumulative_logprob: float | None = None
    """On the last chunk of a best_of or beam search completion: the sum of its tokens' log-probs."""
    """Prompt tokens the completion's prefill reused; set on the completion's last chunk."""
    usage: Usage | None = None
    """Set on the stream's last chunk."""
