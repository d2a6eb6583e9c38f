"""What the pod runtime needs of a pod's front (prefill or decode), and what both fronts share (`CoreFront`).

A front learns its engine's load from every turn of the engine core (`engine.core.outputs.EngineLoad`); the registry
heartbeat reads that snapshot (`PodFront.load()`), so a long engine step never delays a heartbeat.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

from opentelemetry import trace

from common.errors import UnavailableError
from common.metrics import ServiceMetrics
from common.pod_registry import PodRole
from common.telemetry import Tracing
from engine.core.client import EngineCoreClient, EngineDeadError
from engine.core.messages import CoreReady
from engine.core.outputs import CoreOutputs, EngineLoad


class PodFront(Protocol):
    """What the runtime needs of a pod's front."""

    @property
    def num_in_flight(self) -> int:
        """Requests the pod still owes an answer (drain waits for 0)."""
        ...

    def start_draining(self) -> None:
        """Refuse new requests (UNAVAILABLE) from now on; in-flight ones go on."""
        ...

    def load(self) -> EngineLoad:
        """The engine's load as of its core's last turn; never waits for the engine."""
        ...

    @property
    def engine_failed(self) -> bool:
        """The engine core is dead: the pod leaves routing and exits."""
        ...

    @property
    def kv_endpoint(self) -> str:
        """Where prefill pods reach this pod's KV receiver ("" on pods that receive no KV)."""
        ...


def report_load(metrics: ServiceMetrics, load: EngineLoad) -> None:
    """The metrics' engine state (gauges and running totals) from a turn's load snapshot."""
    metrics.set_engine_state(
        num_running=load.num_running,
        num_waiting=load.num_waiting,
        kv_cache_usage=load.kv_cache_usage,
        prefix_cache_queries=load.prefix_cache_queries,
        prefix_cache_hits=load.prefix_cache_hits,
        num_preemptions=load.num_preemptions,
        num_swap_preemptions=0 if load.host_tier is None else load.host_tier.num_swap_preemptions,
    )
    if load.host_tier is not None:
        tier = load.host_tier
        metrics.set_host_tier(
            num_blocks_swapped_out=tier.num_blocks_swapped_out,
            num_blocks_swapped_in=tier.num_blocks_swapped_in,
            host_prefix_cache_hits=load.prefix_cache_host_hits,
            num_slots=tier.num_slots,
            num_swapped_slots=tier.num_swapped_slots,
            num_cached_slots=tier.num_cached_slots,
        )
    metrics.set_spec_totals(
        draft_tokens=load.spec_draft_tokens,
        accepted_tokens=load.spec_accepted_tokens,
        verify_steps=load.spec_verify_steps,
    )


class CoreFront(ABC):
    """A role's front over its engine core: built with the started core's `CoreReady`, attached with `bind`; each
    turn's outputs go to `on_outputs` (which ends with `note_load`), the core's death to `on_dead`."""

    def __init__(
        self, role: PodRole, ready: CoreReady, tracing: Tracing | None, metrics: ServiceMetrics | None
    ) -> None:
        self.role = role
        self.info = ready.info
        self._tracing = tracing or Tracing(trace.NoOpTracer())
        self._metrics = metrics or ServiceMetrics(role)
        self._client: EngineCoreClient | None = None
        self._load = ready.load
        self._draining = False

    def bind(self, client: EngineCoreClient) -> None:
        """Serve over `client`'s core: its outputs and its death come here from now on."""
        self._client = client
        client.attach(self.on_outputs, self.on_dead)

    @property
    def engine_failed(self) -> bool:
        return self._core().failed

    def start_draining(self) -> None:
        self._draining = True

    def load(self) -> EngineLoad:
        return self._load

    @abstractmethod
    def on_outputs(self, out: CoreOutputs) -> None:
        """Every turn of the core, on the event loop."""

    @abstractmethod
    def on_dead(self, error: EngineDeadError) -> None:
        """The engine core died: every open call fails with `error`."""

    def note_load(self, load: EngineLoad) -> None:
        """A turn's load: the heartbeat's snapshot and the metrics' engine state."""
        self._load = load
        report_load(self._metrics, load)

    def _core(self) -> EngineCoreClient:
        if self._client is None:
            raise UnavailableError(f"{self.role} pod is still loading")
        return self._client
