"""The commands a pod sends its engine core, and the one value the core answers a command with.

Every command names the engine request it is about (`req_id`; a KV transfer's id is its request's id). The core
applies commands in the order they were sent, between engine steps, so a command sent after another sees its effect
(an `AbortRequest` sent after a `ReserveKV` frees what the reservation took). Only `ReserveKV` is answered directly
(`KVReserved`); everything else a command causes shows up in the step outputs (`engine.core.outputs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.multimodal import ImageInput
from common.sampling_params import SamplingParams
from kv_transfer.target import KVTarget


@dataclass(slots=True, frozen=True)
class AddRequest:
    """Queue a request. On a prefill pod its prompt KV ships to `kv_target`, a decode pod's reserved blocks, as the
    engine computes it, and its blocks are held until the transfer ends; `keepalive_s` is how long the shipment may
    stay silent before an empty chunk renews the decode pod's reservation. A colocated engine (no KV target) runs
    the request to its end."""

    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    kv_target: KVTarget | None = None
    keepalive_s: float = 0.0
    cache_salt: str | None = None
    images: tuple[ImageInput, ...] = ()  # the prompt's images (a vision-language model's)


@dataclass(slots=True, frozen=True)
class ReserveKV:
    """Decode pods: reserve blocks for `num_prompt_tokens` of prompt KV and start their lease, in one engine-side
    operation (answered by `KVReserved`)."""

    req_id: str
    num_prompt_tokens: int
    lease_s: float


@dataclass(slots=True, frozen=True)
class AddPrefilledRequest:
    """Decode pods: once the reservation's transfer is DONE, claim it and admit the request with its prompt KV
    computed (claim + admit in one engine-side operation); a transfer that ends otherwise fails the request."""

    req_id: str
    prompt_token_ids: list[int]
    first_token_id: int
    params: SamplingParams


@dataclass(slots=True, frozen=True)
class ReleaseKV:
    """Decode pods: end a reservation that no request claimed (its blocks are freed); a no-op once claimed."""

    req_id: str


@dataclass(slots=True, frozen=True)
class AbortRequest:
    """End the request wherever it is: queued, running, waiting for its transfer, or holding KV; its blocks are
    freed and its transfer (if any) aborted. Unknown ids are ignored."""

    req_id: str


@dataclass(slots=True, frozen=True)
class Shutdown:
    """Close the KV transfer backend (live transfers end ABORTED) and stop the core."""


Command = AddRequest | ReserveKV | AddPrefilledRequest | ReleaseKV | AbortRequest | Shutdown


@dataclass(slots=True, frozen=True)
class KVReserved:
    """The answer to `ReserveKV`: the reserved block ids, or None when the pool cannot supply them now."""

    req_id: str
    block_ids: tuple[int, ...] | None
