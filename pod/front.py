"""What the pod runtime needs of a pod's front (prefill or decode), and how a front reports its engine's load.

A front learns its engine's load from every turn of the engine core (`engine.core.outputs.EngineLoad`); the registry
heartbeat reads that snapshot (`PodFront.load()`), so a long engine step never delays a heartbeat.
"""

from __future__ import annotations

from typing import Protocol

from common.metrics import ServiceMetrics
from engine.core.outputs import EngineLoad


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
    )
    metrics.set_spec_totals(
        draft_tokens=load.spec_draft_tokens,
        accepted_tokens=load.spec_accepted_tokens,
        verify_steps=load.spec_verify_steps,
    )
