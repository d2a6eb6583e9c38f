"""A role's load measures (`Signal`): demand spread over the active pods' capacity, against a high and a low
threshold.

- prefill: waiting requests per pod (always); seconds of queued uncached prompt tokens per pod at
  `prefill_tokens_per_s` (only when every active prefill pod reports `queued_prompt_tokens`).
- decode: fraction of KV blocks held by admitted requests over all active pods; requests (running + waiting) per
  pod; with `decode_tpot_slo_ms`, the pods' mean time per step as a fraction of that SLO (its N-1 value assumes the
  lost pod's share of the batch lengthens the others' steps in proportion).

The decode KV measure leaves out the blocks a decode pod holds for reservations not admitted yet
(`num_reserved_blocks`): the router reserves them before the prefill pod starts the prompt, so while prefill is
behind they pile up on decode, and counting them would give decode pods for prefill's backlog (and, on a fixed set of
GPUs, take prefill's). They feed no prefill measure either: each is a request that a prefill pod already counts
(waiting, or in its queued prompt tokens) until its first token, and after that its KV is on the wire, which is no
prefill work: adding them would count prefill's backlog twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.config import AutoscalerConfig
from autoscaler.snapshot import PodSnapshot
from common.pod_registry import PodRole


def _ratio(demand: float, capacity: float) -> float:
    """demand / capacity; no capacity holds no demand (inf) but zero demand (0)."""
    if capacity > 0:
        return demand / capacity
    return 0.0 if demand == 0 else math.inf


@dataclass(slots=True, frozen=True)
class Signal:
    """One measure: `demand` over the sum of `capacities` (one entry per active pod), and its thresholds."""

    name: str
    demand: float
    capacities: tuple[float, ...]
    high: float
    low: float

    @property
    def value(self) -> float:
        return _ratio(self.demand, sum(self.capacities))

    @property
    def value_without_one(self) -> float:
        """The value once the pod of largest capacity is gone (the N-1 check's worst case)."""
        return _ratio(self.demand, sum(self.capacities) - max(self.capacities, default=0.0))

    def over_high(self) -> bool:
        return self.value > self.high

    def under_low(self) -> bool:
        return self.value < self.low

    def fits_without_one(self) -> bool:
        """N-1: the remaining pods would not be over the high threshold."""
        return self.value_without_one <= self.high

    def describe(self) -> str:
        return f"{self.name} {self.value:.2f} (low {self.low:g}, high {self.high:g})"


def role_signals(role: PodRole, pods: tuple[PodSnapshot, ...], config: AutoscalerConfig) -> tuple[Signal, ...]:
    """The measures of `role` on its active `pods` (at least one)."""
    return _prefill_signals(pods, config) if role == "prefill" else _decode_signals(pods, config)


def _prefill_signals(pods: tuple[PodSnapshot, ...], config: AutoscalerConfig) -> tuple[Signal, ...]:
    ones = (1.0,) * len(pods)
    waiting = Signal(
        "waiting requests per pod",
        float(sum(p.num_waiting for p in pods)),
        ones,
        config.prefill_waiting_high,
        config.prefill_waiting_low,
    )
    queued = [p.queued_prompt_tokens for p in pods]
    # NOTE: a partial token count would understate the queue; it counts only when every pod reports one.
    if any(tokens is None for tokens in queued):
        return (waiting,)
    queue_s = sum(t for t in queued if t is not None) / config.prefill_tokens_per_s
    queue = Signal(
        "queued prompt seconds per pod", queue_s, ones, config.prefill_queue_high_s, config.prefill_queue_low_s
    )
    return (waiting, queue)


def _decode_signals(pods: tuple[PodSnapshot, ...], config: AutoscalerConfig) -> tuple[Signal, ...]:
    kv = Signal(
        "admitted KV blocks",
        float(sum(p.num_admitted_blocks for p in pods)),
        tuple(float(p.num_total_blocks) for p in pods),
        config.decode_kv_high,
        config.decode_kv_low,
    )
    requests = Signal(
        "requests per pod",
        float(sum(p.num_running + p.num_waiting for p in pods)),
        (1.0,) * len(pods),
        config.decode_requests_high,
        config.decode_requests_low,
    )
    if not config.decode_tpot_slo_ms:
        return (kv, requests)
    step = Signal(
        "time per step / TPOT SLO",
        sum(p.step_ms for p in pods) / config.decode_tpot_slo_ms,
        (1.0,) * len(pods),
        config.decode_tpot_high,
        config.decode_tpot_low,
    )
    return (kv, requests, step)
