"""What an engine core sends its pod: one `CoreOutputs` per turn of its loop (a step, a batch of commands, or both).

A turn's outputs hold, in this order of meaning:
- `replies`: answers to the commands of the turn (`KVReserved`);
- `failures`: requests a command or a KV transfer ended with an error (`RequestFailed`), instead of an output;
- `outputs`: the step's new tokens and finishes of every request that advanced (`EngineOutput`);
- `transfers_ended` (prefill pods) and `reservations_ended` (decode pods): KV transfers that ended;
- `cache_events` (prefill pods): blocks stored in and evicted from the prefix cache, for the directory;
- `prefill_progress` (prefill pods): tokens computed so far of each request whose prompt the step advanced;
- `load`: the engine's load and totals after the turn.
Errors travel as `ErrorInfo` (plain values), and become pdserve errors again on the pod's side (`to_error`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.errors import InvalidArgumentError, PdserveError, ResourceExhaustedError
from common.kv_cache_events import KVCacheEvent
from engine.core.commands import KVReserved
from engine.scheduler_output import EngineOutput
from kv_transfer.base import TransferStats
from kv_transfer.state import TransferError, TransferState, error_from_code


@dataclass(slots=True, frozen=True)
class ErrorInfo:
    """A pdserve error as plain values: an InvalidArgumentError (`field` set), a KV TransferError (`code`), a
    ResourceExhaustedError (`exhausted`: a decode pod's request that had to leave its full KV pool)."""

    message: str
    field: str | None = None
    code: str | None = None
    exhausted: bool = False

    @classmethod
    def of(cls, error: PdserveError) -> ErrorInfo:
        if isinstance(error, InvalidArgumentError):
            return cls(error.description, field=error.field)
        if isinstance(error, TransferError):
            return cls(str(error), code=error.code)
        return cls(str(error), exhausted=isinstance(error, ResourceExhaustedError))

    def to_error(self) -> PdserveError:
        if self.field is not None:
            return InvalidArgumentError(self.field, self.message)
        if self.code is not None:
            return error_from_code(self.code, self.message)
        if self.exhausted:
            return ResourceExhaustedError(self.message)
        return PdserveError(self.message)


@dataclass(slots=True, frozen=True)
class RequestFailed:
    """A request ended with an error before (or instead of) its outputs."""

    req_id: str
    error: ErrorInfo


@dataclass(slots=True, frozen=True)
class TransferEnded:
    """Prefill pods: a request's KV transfer ended (its held blocks are freed by then), with the sender's stats (their
    `error` left out: it travels as `error`, None after DONE)."""

    req_id: str
    state: TransferState
    stats: TransferStats
    error: ErrorInfo | None = None


@dataclass(slots=True, frozen=True)
class ReservationEnded:
    """Decode pods: a reservation ended without a claim (lease lapsed, released, aborted, failed); its blocks are
    freed."""

    req_id: str
    state: TransferState


@dataclass(slots=True, frozen=True)
class PrefillProgress:
    """Prefill pods: how far a request's prompt is computed after the step; `num_cached_tokens` of its prefix came
    from the cache."""

    req_id: str
    num_computed_tokens: int
    num_cached_tokens: int


@dataclass(slots=True, frozen=True)
class HostTierLoad:
    """The host KV tier (`--swap-space`) after a turn: its running totals and its slots."""

    num_swap_preemptions: int = 0
    """Preemptions that swapped the request out (the rest of `EngineLoad.num_preemptions` recompute)."""
    num_blocks_swapped_out: int = 0
    num_blocks_swapped_in: int = 0
    num_slots: int = 0
    num_swapped_slots: int = 0
    """Slots held by swapped-out requests."""
    num_cached_slots: int = 0
    """Slots of the host prefix tier's LRU."""


@dataclass(slots=True, frozen=True)
class EngineLoad:
    """The engine's load and running totals after a turn (the registry heartbeat and the metrics read it)."""

    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    num_reserved_blocks: int = 0
    """Decode cores: of the blocks not free, those held by reservations whose request is not admitted yet (its
    prompt not yet computed by a prefill pod, or its KV still arriving); 0 elsewhere."""
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_host_hits: int = 0
    """Of `prefix_cache_hits`, the tokens found in the host tier (copied back to the device)."""
    num_preemptions: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_verify_steps: int = 0
    queued_prompt_tokens: int | None = None
    """Prefill cores: prompt tokens not yet computed, over every waiting and running request; None elsewhere."""
    step_ms: float = 0.0
    """Moving average of the time between the starts of consecutive steps while requests run (a decode core's
    time per output token); 0 while none runs."""
    host_tier: HostTierLoad | None = None
    """None without a host tier."""

    @property
    def kv_cache_usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_total_blocks if self.num_total_blocks else 0.0


@dataclass(slots=True)
class CoreOutputs:
    """One turn of the core's loop; see the module docstring. `step_started_ns` (time.time_ns) is 0 when the turn
    ran no step."""

    replies: list[KVReserved] = field(default_factory=list)
    failures: list[RequestFailed] = field(default_factory=list)
    outputs: list[EngineOutput] = field(default_factory=list)
    transfers_ended: list[TransferEnded] = field(default_factory=list)
    reservations_ended: list[ReservationEnded] = field(default_factory=list)
    cache_events: list[KVCacheEvent] = field(default_factory=list)
    prefill_progress: list[PrefillProgress] = field(default_factory=list)
    step_started_ns: int = 0
    load: EngineLoad = field(default_factory=EngineLoad)
