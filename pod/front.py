"""What the pod runtime needs of a pod's core worker (prefill or decode), and the load both report.

The registry heartbeat reads `PodWorker.load()` (a snapshot taken on the engine thread after every step or
command), so a long engine step never delays a heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from common.metrics import ServiceMetrics
from engine.llm_engine import LLMEngine


@dataclass(slots=True, frozen=True)
class PodLoad:
    """What the registry heartbeat reports of the engine (read on the engine thread, after every step or command)."""

    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_total_blocks: int


class PodWorker(Protocol):
    """What the runtime needs of a pod's core worker."""

    @property
    def num_in_flight(self) -> int:
        """Requests the pod still owes an answer (drain waits for 0)."""
        ...

    def start_draining(self) -> None:
        """Refuse new requests (UNAVAILABLE) from now on; in-flight ones go on."""
        ...

    def load(self) -> PodLoad:
        """The engine's load as of its last step or command; never waits for the engine thread."""
        ...

    @property
    def engine_failed(self) -> bool:
        """The engine can run no further step: the pod leaves routing and exits."""
        ...

    @property
    def kv_endpoint(self) -> str:
        """Where prefill pods reach this pod's KV receiver ("" on pods that receive no KV)."""
        ...


def read_load(engine: LLMEngine) -> PodLoad:
    """The engine's load numbers; call on the engine thread (e.g. from AsyncEngine's on_update hook)."""
    return PodLoad(
        engine.scheduler.num_running,
        engine.scheduler.num_waiting,
        engine.kv_cache_manager.num_free_blocks,
        engine.info.num_blocks,
    )


def report_engine_state(metrics: ServiceMetrics, engine: LLMEngine) -> PodLoad:
    """Engine thread: the load numbers, also set as the metrics' engine state (gauges and running totals)."""
    load = read_load(engine)
    metrics.set_engine_state(
        num_running=load.num_running,
        num_waiting=load.num_waiting,
        kv_cache_usage=1.0 - load.num_free_blocks / load.num_total_blocks,
        prefix_cache_queries=engine.kv_cache_manager.stats.queries,
        prefix_cache_hits=engine.kv_cache_manager.stats.hits,
        num_preemptions=engine.scheduler.num_preemptions,
    )
    spec = engine.spec_stats
    metrics.set_spec_totals(
        draft_tokens=spec.draft_tokens, accepted_tokens=spec.accepted_tokens, verify_steps=spec.verify_steps
    )
    return load
