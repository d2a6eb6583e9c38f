"""The autoscaler's planner: sequences of snapshots give exact decision sequences; metrics count each decision."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from autoscaler.config import AutoscalerConfig
from autoscaler.metrics import AutoscalerMetrics
from autoscaler.planner import Decision, Planner
from autoscaler.signals import role_signals
from autoscaler.snapshot import ClusterSnapshot, PodSnapshot
from common.errors import InvalidArgumentError
from common.pod_registry import PodInfo, PodRole

CONFIG = AutoscalerConfig(
    min_prefill=1,
    max_prefill=3,
    min_decode=1,
    max_decode=3,
    scale_down_window_s=30.0,
    action_timeout_s=60.0,
    prefill_waiting_high=4.0,
    prefill_waiting_low=1.0,
    prefill_tokens_per_s=1000.0,
    prefill_queue_high_s=1.0,
    prefill_queue_low_s=0.25,
    decode_kv_high=0.8,
    decode_kv_low=0.4,
    decode_requests_high=100.0,
    decode_requests_low=10.0,
)
IDLE_DECODE = "at min 1: admitted KV blocks 0.00 (low 0.4, high 0.8); requests per pod 0.00 (low 10, high 100)"
LOW_DECODE = "admitted KV blocks 0.10 (low 0.4, high 0.8); requests per pod 0.00 (low 10, high 100)"

Step = tuple[str, int, int]
"""(direction, current, desired) of one decision."""


def prefill(*waiting: int, tokens: tuple[int | None, ...] = ()) -> tuple[PodSnapshot, ...]:
    """One prefill pod per `waiting` count; `tokens`: their queued prompt tokens (default: not reported)."""
    queued = tokens or (None,) * len(waiting)
    return tuple(
        PodSnapshot("prefill", f"prefill-{i}", num_waiting=w, queued_prompt_tokens=t)
        for i, (w, t) in enumerate(zip(waiting, queued, strict=True))
    )


def decode(*used: int, total: int = 100, reserved: int = 0) -> tuple[PodSnapshot, ...]:
    """One decode pod of `total` KV blocks per `used` count, `reserved` of them held by reservations not admitted."""
    return tuple(
        PodSnapshot(
            "decode", f"decode-{i}", num_free_blocks=total - u, num_total_blocks=total, num_reserved_blocks=reserved
        )
        for i, u in enumerate(used)
    )


def at(now_s: float, *groups: tuple[PodSnapshot, ...], pending: frozenset[PodRole] = frozenset()) -> ClusterSnapshot:
    return ClusterSnapshot(now_s, tuple(p for group in groups for p in group), pending)


def steps(decisions: list[Decision]) -> list[Step]:
    return [(d.direction, d.current, d.desired) for d in decisions]


def run(planner: Planner, snapshots: list[ClusterSnapshot]) -> tuple[list[Decision], list[Decision]]:
    """(prefill decisions, decode decisions), one per snapshot."""
    pairs = [planner.decide(s) for s in snapshots]
    return [p for p, _ in pairs], [d for _, d in pairs]


def test_scale_out_is_immediate_one_step_per_call_and_stops_at_max() -> None:
    snapshots = [at(0, prefill(20), decode(0)), at(10, prefill(10, 10), decode(0)), at(20, prefill(9, 9, 9), decode(0))]
    prefills, decodes = run(Planner(CONFIG), snapshots)
    assert steps(prefills) == [("up", 1, 2), ("up", 2, 3), ("hold", 3, 3)]
    assert [d.reason for d in prefills] == [
        "waiting requests per pod 20.00 > high 4",
        "waiting requests per pod 10.00 > high 4",
        "at max 3: waiting requests per pod 9.00 > high 4",
    ]
    assert steps(decodes) == [("hold", 1, 1)] * 3
    assert decodes[0].reason == IDLE_DECODE


def test_scale_in_only_after_the_sustained_window() -> None:
    snapshots = [at(t, prefill(0), decode(10, 10)) for t in (0, 10, 20, 30)] + [at(40, prefill(0), decode(10))]
    _, decodes = run(Planner(CONFIG), snapshots)
    assert steps(decodes) == [("hold", 2, 2)] * 3 + [("down", 2, 1), ("hold", 1, 1)]
    assert [d.reason for d in decodes[:4]] == [
        f"low for 0 s of 30 s: {LOW_DECODE}",
        f"low for 10 s of 30 s: {LOW_DECODE}",
        f"low for 20 s of 30 s: {LOW_DECODE}",
        f"low for 30 s and N-1 fits: {LOW_DECODE}",
    ]
    assert decodes[4].reason == "at min 1: " + LOW_DECODE


def test_a_dip_shorter_than_the_window_holds_and_the_window_restarts_when_the_condition_breaks() -> None:
    used = [10, 10, 50, 10, 10, 10, 10]
    snapshots = [at(10 * i, prefill(0), decode(u, u)) for i, u in enumerate(used)]
    _, decodes = run(Planner(CONFIG), snapshots)
    assert steps(decodes) == [("hold", 2, 2)] * 6 + [("down", 2, 1)]
    assert decodes[2].reason == (
        "within thresholds: admitted KV blocks 0.50 (low 0.4, high 0.8); requests per pod 0.00 (low 10, high 100)"
    )
    assert [d.reason.split(":")[0] for d in decodes[3:]] == [
        "low for 0 s of 30 s",
        "low for 10 s of 30 s",
        "low for 20 s of 30 s",
        "low for 30 s and N-1 fits",
    ]


def test_the_n_minus_one_check_refuses_a_scale_in_and_its_failure_restarts_the_window() -> None:
    # 150 of 500 blocks in use (0.3, under low), but the 100-block pod alone would be at 1.5 without the big one.
    crowded = (*decode(100, total=100), *decode(50, total=400))
    eased = (*decode(20, total=100), *decode(20, total=400))
    snapshots = [at(10 * i, prefill(0), crowded) for i in range(5)]
    snapshots += [at(10 * i, prefill(0), eased) for i in range(5, 9)]
    _, decodes = run(Planner(CONFIG), snapshots)
    assert steps(decodes) == [("hold", 2, 2)] * 8 + [("down", 2, 1)]
    assert {d.reason for d in decodes[:5]} == {
        "N-1 check fails: admitted KV blocks would be 1.50 > high 0.8 without one of 2 pods"
    }
    assert decodes[8].reason.startswith("low for 30 s and N-1 fits: admitted KV blocks 0.08")


def test_no_new_change_while_the_previous_one_is_pending() -> None:
    snapshots = [
        at(0, prefill(20), decode(0)),
        at(10, prefill(20), decode(0)),  # the second pod has not registered yet
        at(20, prefill(10, 10), decode(0), pending=frozenset({"prefill"})),  # the connector is not done
        at(30, prefill(10, 10), decode(0)),
    ]
    prefills, decodes = run(Planner(CONFIG), snapshots)
    assert steps(prefills) == [("up", 1, 2), ("hold", 1, 1), ("hold", 2, 2), ("up", 2, 3)]
    assert [d.reason for d in prefills[1:3]] == [
        "pending: waiting for 2 pods (now 1) since 0 s",
        "pending: the connector is still applying the previous change",
    ]
    assert steps(decodes) == [("hold", 1, 1)] * 4


def test_a_pending_change_lapses_after_the_action_timeout() -> None:
    snapshots = [at(t, prefill(20), decode(0)) for t in (0, 10, 59, 60)]
    prefills, _ = run(Planner(CONFIG), snapshots)
    assert steps(prefills) == [("up", 1, 2), ("hold", 1, 1), ("hold", 1, 1), ("up", 1, 2)]


def test_the_window_does_not_run_while_a_change_is_pending() -> None:
    # The scale-in at 30 s shows in the registry at 50 s; the next window starts there, so the next scale-in is at 80.
    counts = [3, 3, 3, 3, 3, 2, 2, 2, 2, 2]
    snapshots = [at(10 * i, prefill(0), decode(*[10] * n)) for i, n in enumerate(counts)]
    _, decodes = run(Planner(CONFIG), snapshots)
    expected = [("hold", 3, 3)] * 3 + [("down", 3, 2), ("hold", 3, 3), ("hold", 2, 2)]
    assert steps(decodes) == [*expected, ("hold", 2, 2), ("hold", 2, 2), ("down", 2, 1), ("hold", 2, 2)]


def test_draining_pods_are_no_capacity() -> None:
    pods = (*prefill(6), PodSnapshot("prefill", "prefill-old", draining=True))
    prefill_decision, _ = Planner(CONFIG).decide(at(0, pods, decode(0)))
    assert (prefill_decision.direction, prefill_decision.current, prefill_decision.desired) == ("up", 1, 2)


def test_outside_min_or_max_moves_one_step_toward_the_bound_whatever_the_load() -> None:
    config = dataclasses.replace(CONFIG, max_prefill=2, min_decode=2)
    snapshots = [
        at(0, prefill(0, 0, 0)),
        at(10, prefill(0, 0), decode(0)),
        at(20, prefill(10, 10), decode(0, 0)),
        at(100, prefill(0, 0), decode(0, 0)),
    ]
    prefills, decodes = run(Planner(config), snapshots)
    assert steps(prefills) == [("down", 3, 2), ("hold", 2, 2), ("hold", 2, 2), ("hold", 2, 2)]
    assert steps(decodes) == [("up", 0, 1), ("up", 1, 2), ("hold", 2, 2), ("hold", 2, 2)]
    assert [prefills[0].reason, decodes[0].reason] == ["above max 2", "below min 2"]
    assert prefills[2].reason == "at max 2: waiting requests per pod 10.00 > high 4"
    assert decodes[3].reason.startswith("at min 2: ")


def test_each_role_is_decided_alone() -> None:
    snapshots = [
        at(0, prefill(20), decode(50)),
        at(10, prefill(10, 10), decode(90), pending=frozenset({"decode"})),
    ]
    prefills, decodes = run(Planner(CONFIG), snapshots)
    assert steps(prefills) == [("up", 1, 2), ("up", 2, 3)]
    assert steps(decodes) == [("hold", 1, 1), ("hold", 1, 1)]


def test_decode_kv_full_of_reservations_waiting_on_prefill_does_not_scale_decode_up() -> None:
    # Prefill is behind: the reservations of its backlog hold 85 of the 90 blocks in use on each decode pod.
    prefills, decodes = run(Planner(CONFIG), [at(0, prefill(20), decode(90, 90, reserved=85))])
    assert steps(prefills) == [("up", 1, 2)]
    assert steps(decodes) == [("hold", 2, 2)]
    assert decodes[0].reason == (
        "low for 0 s of 30 s: admitted KV blocks 0.05 (low 0.4, high 0.8); requests per pod 0.00 (low 10, high 100)"
    )
    # The same blocks held by admitted requests scale decode up.
    _, decodes = run(Planner(CONFIG), [at(0, prefill(20), decode(90, 90))])
    assert steps(decodes) == [("up", 2, 3)]


def test_queued_prompt_tokens_count_when_every_prefill_pod_reports_them() -> None:
    snapshots = [at(0, prefill(1, 1, tokens=(3000, None)), decode(0)), at(10, prefill(1, tokens=(1500,)), decode(0))]
    prefills, _ = run(Planner(CONFIG), snapshots)
    assert steps(prefills) == [("hold", 2, 2), ("up", 1, 2)]
    assert [d.reason for d in prefills] == [
        "within thresholds: waiting requests per pod 1.00 (low 1, high 4)",
        "queued prompt seconds per pod 1.50 > high 1",
    ]


def simulate(
    planner: Planner, load: Callable[[float, int, int], ClusterSnapshot], times: range
) -> list[tuple[float, str, str]]:
    """Each non-hold decision as (now, role, direction); the pods follow the desired counts at once."""
    counts = {"prefill": 1, "decode": 3}
    changes: list[tuple[float, str, str]] = []
    for now in times:
        for decision in planner.decide(load(now, counts["prefill"], counts["decode"])):
            counts[decision.role] = decision.desired
            if decision.direction != "hold":
                changes.append((now, decision.role, decision.direction))
    return changes


def test_an_oscillating_load_at_a_threshold_changes_at_most_once_per_window() -> None:
    def load(now: float, num_prefill: int, num_decode: int) -> ClusterSnapshot:
        high_phase = now % 20 == 0
        waiting = 5 if high_phase else 3  # around prefill_waiting_high x 1 pod
        used = 90 if not high_phase else 30  # around decode_kv_low x 2 pods
        return at(now, prefill(waiting, *[0] * (num_prefill - 1)), decode(used, *[0] * (num_decode - 1)))

    changes = simulate(Planner(CONFIG), load, range(0, 600, 10))
    assert changes == [(0, "prefill", "up"), (30, "decode", "down")]


def test_every_decision_is_counted_and_each_change_logged(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    metrics = AutoscalerMetrics(registry)
    snapshots = [at(0, prefill(20), decode(0)), at(10, prefill(10, 10), decode(0)), at(20, prefill(9, 9, 9), decode(0))]
    planner = Planner(CONFIG)
    with caplog.at_level(logging.INFO, logger="autoscaler.metrics"):
        for decision in (d for s in snapshots for d in planner.decide(s)):
            metrics.record(decision)
    value = registry.get_sample_value
    assert value("pdserve:autoscaler_desired_replicas", {"role": "prefill"}) == 3.0
    assert value("pdserve:autoscaler_desired_replicas", {"role": "decode"}) == 1.0
    assert value("pdserve:autoscaler_scaling_decisions_total", {"role": "prefill", "direction": "up"}) == 2.0
    assert value("pdserve:autoscaler_scaling_decisions_total", {"role": "prefill", "direction": "hold"}) == 1.0
    assert value("pdserve:autoscaler_scaling_decisions_total", {"role": "decode", "direction": "hold"}) == 3.0
    assert value("pdserve:autoscaler_scaling_decisions_total", {"role": "decode", "direction": "up"}) is None
    assert caplog.messages == [
        "autoscaler: prefill up 1 -> 2: waiting requests per pod 20.00 > high 4",
        "autoscaler: prefill up 2 -> 3: waiting requests per pod 10.00 > high 4",
    ]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"min_decode": 0}, "min_decode"),
        ({"min_prefill": 3, "max_prefill": 2}, "max_prefill"),
        ({"autoscale_interval_s": 0.0}, "autoscale_interval_s"),
        ({"scale_down_window_s": -1.0}, "scale_down_window_s"),
        ({"prefill_tokens_per_s": 0.0}, "prefill_tokens_per_s"),
        ({"prefill_waiting_low": 4.0}, "prefill_waiting_high"),
        ({"decode_kv_high": 1.5}, "decode_kv_high"),
        ({"decode_requests_low": -1.0}, "decode_requests_low"),
        ({"decode_tpot_slo_ms": -1.0}, "decode_tpot_slo_ms"),
        ({"decode_tpot_low": 0.9}, "decode_tpot_high"),
        ({"max_total_pods": 1}, "max_total_pods"),
    ],
)
def test_config_rejects_bad_values(changes: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        dataclasses.replace(CONFIG, **changes)
    assert raised.value.field == field


def test_a_snapshot_of_a_registry_entry() -> None:
    info = PodInfo(
        "decode-0",
        "decode",
        "h:1",
        "m",
        1,
        draining=True,
        num_running=2,
        num_waiting=3,
        num_free_blocks=4,
        num_total_blocks=10,
        num_reserved_blocks=5,
        queued_prompt_tokens=7,
        step_ms=12.5,
    )
    assert PodSnapshot.from_pod_info(info) == PodSnapshot(
        "decode",
        "decode-0",
        draining=True,
        num_running=2,
        num_waiting=3,
        num_free_blocks=4,
        num_total_blocks=10,
        num_reserved_blocks=5,
        queued_prompt_tokens=7,
        step_ms=12.5,
    )
    assert PodSnapshot.from_pod_info(info).num_admitted_blocks == 1


def test_an_entry_of_a_pod_that_does_not_report_reservations_reads_as_none_reserved() -> None:
    entry = PodInfo("decode-0", "decode", "h:1", "m", 1, num_free_blocks=4, num_total_blocks=10).to_json()
    older = entry.replace(',"num_reserved_blocks":0', "")
    assert "num_reserved_blocks" not in older
    snapshot = PodSnapshot.from_pod_info(PodInfo.from_json(older))
    assert (snapshot.num_reserved_blocks, snapshot.num_admitted_blocks) == (0, 6)


def test_the_decode_kv_measure_leaves_out_reserved_blocks() -> None:
    # The third pod reports no reservations (an older pod): all its used blocks count.
    pods = (*decode(90, reserved=60), *decode(50, reserved=50), *decode(3, total=10))
    (kv, _) = role_signals("decode", pods, CONFIG)
    assert (kv.demand, kv.capacities) == (33.0, (100.0, 100.0, 10.0))
    assert kv.value == pytest.approx(33 / 210)
