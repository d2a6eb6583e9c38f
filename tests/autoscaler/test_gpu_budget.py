"""The planner on a fixed set of GPUs (`max_total_pods`) and on the decode pods' time per step: exact decisions."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from autoscaler.commands import add_up_flags, autoscaler_config
from autoscaler.planner import Planner
from autoscaler.snapshot import PodSnapshot
from tests.autoscaler.test_planner import CONFIG, at, decode, prefill, run, steps

ON_3_GPUS = dataclasses.replace(CONFIG, max_total_pods=3, scale_down_window_s=300.0)


def test_a_role_over_its_threshold_holds_when_every_gpu_holds_a_pod() -> None:
    snapshots = [at(0, prefill(20), decode(0)), at(10, prefill(10, 10), decode(0))]
    prefills, decodes = run(Planner(ON_3_GPUS), snapshots)
    assert steps(prefills) == [("up", 1, 2), ("hold", 2, 2)]
    assert prefills[1].reason == "no GPU free: waiting requests per pod 10.00 > high 4"
    # NOTE: decode is at its min: it has no pod to give.
    assert steps(decodes) == [("hold", 1, 1)] * 2


def test_a_gpu_moves_from_the_idle_role_to_the_loaded_one_once_its_pod_is_gone() -> None:
    loaded = decode(90)
    draining = (prefill(0)[0], dataclasses.replace(prefill(0, 0)[1], draining=True))
    snapshots = [
        at(0, prefill(0, 0), loaded),  # 3 pods on 3 GPUs: decode takes one of prefill's
        at(10, draining, loaded),  # the drained prefill pod still holds its GPU
        at(20, prefill(0), loaded),  # gone: its GPU is free
        at(30, prefill(0), loaded),  # the new decode pod has not registered yet
        at(40, prefill(0), decode(45, 45)),
    ]
    prefills, decodes = run(Planner(ON_3_GPUS), snapshots)
    assert steps(prefills) == [("down", 2, 1), ("hold", 1, 1), ("hold", 1, 1), ("hold", 1, 1), ("hold", 1, 1)]
    assert prefills[0].reason == ("gives its GPU to decode; N-1 fits: waiting requests per pod 0.00 (low 1, high 4)")
    assert steps(decodes) == [("hold", 1, 1), ("hold", 1, 1), ("up", 1, 2), ("hold", 1, 1), ("hold", 2, 2)]
    assert decodes[0].reason == "no GPU free: admitted KV blocks 0.90 > high 0.8"
    assert decodes[3].reason == "pending: waiting for 2 pods (now 1) since 20 s"


def test_a_role_that_cannot_spare_a_pod_keeps_it() -> None:
    # Prefill would be at 6 waiting per pod (over high 4) without one of its two pods: the N-1 check refuses.
    prefills, decodes = run(Planner(ON_3_GPUS), [at(0, prefill(3, 3), decode(90))])
    assert steps(prefills) == [("hold", 2, 2)]
    assert steps(decodes) == [("hold", 1, 1)]
    assert decodes[0].reason == "no GPU free: admitted KV blocks 0.90 > high 0.8"


def test_decode_kv_full_of_reservations_takes_no_gpu_from_prefill() -> None:
    # Prefill could spare a pod, but decode's KV is full only of reservations (85 of 90 blocks): decode wants none.
    prefills, decodes = run(Planner(ON_3_GPUS), [at(0, prefill(1, 1), decode(90, reserved=85))])
    assert steps(prefills) == [("hold", 2, 2)]
    assert steps(decodes) == [("hold", 1, 1)]
    assert decodes[0].reason == (
        "at min 1: admitted KV blocks 0.05 (low 0.4, high 0.8); requests per pod 0.00 (low 10, high 100)"
    )


def test_a_prefill_backlog_takes_the_gpu_of_a_decode_pod_holding_its_reservations() -> None:
    prefills, decodes = run(Planner(ON_3_GPUS), [at(0, prefill(20), decode(90, 90, reserved=85))])
    assert steps(prefills) == [("hold", 1, 1)]
    assert prefills[0].reason == "no GPU free: waiting requests per pod 20.00 > high 4"
    assert steps(decodes) == [("down", 2, 1)]
    assert decodes[0].reason == (
        "gives its GPU to prefill; N-1 fits: admitted KV blocks 0.05 (low 0.4, high 0.8);"
        " requests per pod 0.00 (low 10, high 100)"
    )


def test_without_a_budget_both_roles_grow() -> None:
    prefills, decodes = run(Planner(CONFIG), [at(0, prefill(10, 10), decode(90))])
    assert steps(prefills) == [("up", 2, 3)]
    assert steps(decodes) == [("up", 1, 2)]


def test_the_decode_step_time_against_the_tpot_slo() -> None:
    config = dataclasses.replace(CONFIG, decode_tpot_slo_ms=15.0, decode_tpot_high=0.8, decode_tpot_low=0.4)

    def pods(*step_ms: float) -> tuple[PodSnapshot, ...]:
        return tuple(
            dataclasses.replace(pod, step_ms=ms) for pod, ms in zip(decode(*[50] * len(step_ms)), step_ms, strict=True)
        )

    _, decodes = run(Planner(config), [at(0, prefill(0), pods(13.5))])
    assert steps(decodes) == [("up", 1, 2)]
    assert decodes[0].reason == "time per step / TPOT SLO 0.90 > high 0.8"
    # Two pods at 6 ms: 0.40 now, 0.80 on one pod (the N-1 check's linear model): not under low, no scale-in.
    _, decodes = run(Planner(config), [at(0, prefill(0), pods(6.0, 6.0))])
    assert decodes[0].reason == (
        "within thresholds: admitted KV blocks 0.50 (low 0.4, high 0.8); requests per pod 0.00 (low 10, high 100);"
        " time per step / TPOT SLO 0.40 (low 0.4, high 0.8)"
    )


@pytest.mark.parametrize(
    ("argv", "gpus", "max_total_pods"),
    [
        (["--autoscale"], ("0", "1", "2", "3"), 4),
        (["--autoscale", "--max-total-pods", "6"], ("0", "1", "2", "3"), 6),
        (["--autoscale"], ("0",), 0),  # fewer GPUs than min_prefill + min_decode: no budget (pods share)
        (["--autoscale"], (), 0),
    ],
)
def test_pdserve_up_autoscale_puts_one_pod_on_each_gpu_by_default(
    argv: list[str], gpus: tuple[str, ...], max_total_pods: int
) -> None:
    parser = argparse.ArgumentParser()
    add_up_flags(parser)
    config = autoscaler_config(parser.parse_args(argv), gpus)
    assert config is not None and config.max_total_pods == max_total_pods
    assert autoscaler_config(parser.parse_args([]), gpus) is None
