"""What the completions the router runs share (`RunContext`), and what the completions of one Generate call
share (`PromptPlan`)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from opentelemetry import trace
from transformers import PreTrainedTokenizerBase

from common.metrics import ServiceMetrics
from common.multimodal import ImageInput
from common.telemetry import Tracing
from router.admission.admission import RouterAdmission
from router.completion.migration import RetryBudget
from router.pods.local_load import LocalLoads
from router.pods.pod_view import PodView
from router.pods.routing_policy import RoutingPolicy


@dataclass(slots=True, frozen=True)
class RunContext:
    """What every completion the router runs shares."""

    pods: PodView
    policy: RoutingPolicy
    load: LocalLoads
    tokenizer: PreTrainedTokenizerBase
    block_size: int
    max_attempts: int
    """Failed legs (pods that failed a Reserve, Prefill or Decode) one completion may have before it fails."""
    clock: Callable[[], float]
    admission: RouterAdmission
    """Which calls wait, and for how long (a completion that finds no room waits there too)."""
    tracing: Tracing = field(default_factory=lambda: Tracing(trace.NoOpTracer()))
    metrics: ServiceMetrics = field(default_factory=lambda: ServiceMetrics("router"))
    retry_budget: RetryBudget = field(default_factory=lambda: RetryBudget(rate_per_s=10.0, burst=100))
    """Retries left to the whole router (see router.completion.migration)."""
    rng: random.Random = field(default_factory=random.Random)
    """Jitter of the backoff between attempts."""

    def remaining_s(self, deadline: float | None) -> float | None:
        """Seconds left until `deadline` (a `clock` time; None: no deadline)."""
        if deadline is None:
            return None
        return max(deadline - self.clock(), 0.0)


@dataclass(slots=True, frozen=True)
class PromptPlan:
    """What the completions of one Generate call share: the prompt and where its prefix is cached."""

    request_id: str
    token_ids: list[int]
    routing_key: bytes
    cached_blocks: Mapping[str, float]
    cache_salt: str | None
    arrival: float
    deadline: float | None
    directory_latency_s: float | None = None
    """How long the prefix directory lookup took (None: none was made)."""
    images: tuple[ImageInput, ...] = ()
    """The prompt's images, at their placeholders in token_ids (a migrated leg's prompt keeps them in place)."""
