"""report_load: a core turn's load snapshot moves the pod's metrics, the host tier's included."""

from __future__ import annotations

from common.metrics import ServiceMetrics
from engine.core.outputs import EngineLoad, HostTierLoad
from pod.front import report_load


def _value(metrics: ServiceMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(f"pdserve:{name}", {"role": metrics.role, **labels})


def test_a_load_snapshot_moves_the_preemption_and_host_tier_metrics() -> None:
    metrics = ServiceMetrics("decode")
    tier = HostTierLoad(
        num_swap_preemptions=3,
        num_blocks_swapped_out=17,
        num_blocks_swapped_in=12,
        num_slots=64,
        num_swapped_slots=5,
        num_cached_slots=11,
    )
    report_load(metrics, EngineLoad(num_preemptions=2))
    load = EngineLoad(
        num_free_blocks=6, num_total_blocks=8, num_preemptions=5, prefix_cache_host_hits=32, host_tier=tier
    )
    report_load(metrics, load)
    assert [_value(metrics, "num_preemptions_total", mode=mode) for mode in ("recompute", "swap")] == [2.0, 3.0]
    assert _value(metrics, "kv_swapped_out_blocks_total") == 17
    assert _value(metrics, "kv_swapped_in_blocks_total") == 12
    assert _value(metrics, "host_prefix_cache_hits_total") == 32
    assert _value(metrics, "cpu_cache_usage_perc") == 0.25
    blocks = [_value(metrics, "host_kv_cache_blocks", state=state) for state in ("swapped", "cached", "free")]
    assert blocks == [5.0, 11.0, 48.0]
    assert _value(metrics, "kv_cache_usage_perc") == 0.25
