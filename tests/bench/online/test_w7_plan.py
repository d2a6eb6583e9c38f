"""W7's plan on CPU (`--dry-run`, nothing runs): where the colocated engine and the cluster's pods run with
`--gpus`, and the GPUs each system's per-GPU goodput divides by."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from bench.online.cli import add_arguments, run
from common.errors import InvalidArgumentError

COLOCATED = {"engines": 1, "gpus": 1, "device": "cuda:0 of the benchmark's environment"}


def plan(*flags: str) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload")
    add_arguments(parser)
    result = run(parser.parse_args(["--workload", "w7", "--dry-run", *flags]))
    assert result["workload"] == "w7" and "colocated" not in result and "disaggregated" not in result
    return dict(result["plan"])


def test_one_prefill_and_one_decode_on_two_gpus_against_one_engine_per_gpu() -> None:
    assert plan("--gpus", "0,1") == {
        "colocated": COLOCATED,
        "disaggregated": {"cluster": "LocalCluster", "gpus": 2, "pod_gpus": {"prefill-0": "0", "decode-0": "1"}},
    }


def test_the_cluster_counts_the_gpus_its_pods_use() -> None:
    assert plan("--gpus", "4,5,6,7")["disaggregated"] == {
        "cluster": "LocalCluster",
        "gpus": 2,
        "pod_gpus": {"prefill-0": "4", "decode-0": "5"},
    }
    assert plan("--gpus", "0,1", "--num-prefill", "2", "--num-decode", "2")["disaggregated"] == {
        "cluster": "LocalCluster",
        "gpus": 2,
        "pod_gpus": {"prefill-0": "0", "prefill-1": "1", "decode-0": "0", "decode-1": "1"},
    }


def test_without_gpus_the_cluster_is_one_gpu_unless_told() -> None:
    assert plan() == {"colocated": COLOCATED, "disaggregated": {"cluster": "LocalCluster", "gpus": 1, "pod_gpus": {}}}
    assert plan("--gpus", "0,1", "--cluster-gpus", "4")["disaggregated"]["gpus"] == 4
    assert plan("--address", "10.0.0.5:50051", "--cluster-gpus", "2")["disaggregated"] == {
        "cluster": "10.0.0.5:50051",
        "gpus": 2,
        "pod_gpus": {},
    }


def test_bad_gpu_ids_name_the_flag() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        plan("--gpus", "0,0")
    assert (caught.value.field, caught.value.description) == ("gpus", "a GPU is named twice: 0,0")
